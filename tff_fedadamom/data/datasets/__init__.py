"""One module per data set; the registry in :mod:`tff_fedadamom.data.registry`."""
