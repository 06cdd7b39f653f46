"""Learning processes whose clients do more than SGD: FedCAda and FAFED.

Ground floor: these builders know TFF only (no configs, runners or Ray). Each
returns a `tff.learning.templates.LearningProcess` composed from TFF's
templates; see `_common` for the composition they share.
"""

from tff_fedadamom.algorithms.fafed import build_fafed
from tff_fedadamom.algorithms.fedcada import build_fedcada

__all__ = ["build_fafed", "build_fedcada"]
