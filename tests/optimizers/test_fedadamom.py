"""FedAdamom-specific tests: the update rule, structures, TFF execution, errors."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom.optimizers import build_fedadamom
from tff_fedadamom.optimizers import fedadamom

LR_KEY = tff.learning.optimizers.LEARNING_RATE_KEY


def numpy_fedadamom(weights, grads_per_step, lr, beta_2, eps):
  """Reference implementation over a list of numpy leaves (float64)."""
  w = [np.asarray(x, np.float64) for x in weights]
  m = [np.zeros_like(x) for x in w]
  v = [np.zeros_like(x) for x in w]
  for grads in grads_per_step:
    v = [beta_2 * vi + (1 - beta_2) * np.square(g) for vi, g in zip(v, grads)]
    vbar = np.concatenate([vi.ravel() for vi in v]).mean()
    betas = [np.clip(1 - vi / vbar, 0, 1 - eps) for vi in v]
    m = [b * mi + (1 - b) * g for b, mi, g in zip(betas, m, grads)]
    w = [wi - lr * mi for wi, mi in zip(w, m)]
  return w, m, v


def _run(opt, weights, grads_per_step):
  specs = tf.nest.map_structure(
      lambda t: tf.TensorSpec(t.shape, t.dtype), weights
  )
  state = opt.initialize(specs)
  for grads in grads_per_step:
    state, weights = opt.next(state, weights, grads)
  return state, weights


class TestStateStructure:

  def test_initial_state(self):
    specs = [tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.float64)]
    state = build_fedadamom(0.5, beta_2=0.2, epsilon=0.01).initialize(specs)
    assert list(state) == [
        LR_KEY,
        fedadamom.BETA_2_KEY,
        fedadamom.EPSILON_KEY,
        fedadamom.ACCUMULATOR_KEY,
        fedadamom.PRECONDITIONER_KEY,
    ]
    assert state[LR_KEY] == 0.5
    assert state[fedadamom.BETA_2_KEY] == 0.2
    assert state[fedadamom.EPSILON_KEY] == 0.01
    for slot in (fedadamom.ACCUMULATOR_KEY, fedadamom.PRECONDITIONER_KEY):
      assert [t.dtype for t in state[slot]] == [tf.float32, tf.float64]
      assert all(not np.any(t.numpy()) for t in state[slot])

  def test_defaults_follow_the_paper(self):
    state = build_fedadamom().initialize([tf.TensorSpec([1], tf.float32)])
    assert state[LR_KEY] == 1.0
    assert state[fedadamom.BETA_2_KEY] == 0.05
    assert state[fedadamom.EPSILON_KEY] == 1e-3


class TestMath:

  def test_first_step_by_hand(self):
    # g = [1, 2, 3], beta_2 = 0.05: v = 0.95 g^2 = [0.95, 3.8, 8.55],
    # vbar = 13.3 / 3, beta1 = 1 - v / vbar = [11/14, 1/7, -0.93 -> 0],
    # m = (1 - beta1) g = [3/14, 12/7, 3], w = 1 - m.
    opt = build_fedadamom(1.0, beta_2=0.05, epsilon=1e-3)
    state, w = _run(opt, [tf.ones(3)], [[tf.constant([1.0, 2.0, 3.0])]])
    np.testing.assert_allclose(
        state[fedadamom.PRECONDITIONER_KEY][0], [0.95, 3.8, 8.55], rtol=1e-6
    )
    np.testing.assert_allclose(
        state[fedadamom.ACCUMULATOR_KEY][0], [3 / 14, 12 / 7, 3.0], rtol=1e-6
    )
    np.testing.assert_allclose(w[0], [11 / 14, 1 - 12 / 7, -2.0], rtol=1e-6)

  def test_clip_at_upper_bound(self):
    # A zero coordinate has v = 0 -> 1 - v/vbar = 1, clipped to 1 - eps.
    eps = 0.1
    opt = build_fedadamom(1.0, beta_2=0.0, epsilon=eps)
    grads = [
        [tf.constant([1.0, 1.0])],
        [tf.constant([0.0, 1.0])],
    ]
    state, _ = _run(opt, [tf.zeros(2)], grads)
    # Step 1: all v equal -> beta1 = 0 -> m = g = [1, 1].
    # Step 2: v = [0, 1], vbar = 0.5, beta1 = [clip(1, 0, 0.9), clip(-1)] = [0.9, 0]
    # m = [0.9 * 1 + 0.1 * 0, 1] = [0.9, 1].
    np.testing.assert_allclose(
        state[fedadamom.ACCUMULATOR_KEY][0], [0.9, 1.0], rtol=1e-6
    )

  def test_clip_at_lower_bound(self):
    # 1 - v/vbar < 0 for the large coordinate: beta1 = 0, momentum forgotten.
    opt = build_fedadamom(1.0, beta_2=0.0, epsilon=1e-3)
    grads = [[tf.constant([2.0, 2.0])], [tf.constant([0.1, 5.0])]]
    state, _ = _run(opt, [tf.zeros(2)], grads)
    m = state[fedadamom.ACCUMULATOR_KEY][0].numpy()
    assert m[1] == pytest.approx(5.0)  # previous momentum 2.0 fully dropped
    # 1 - 0.01 / 12.505 = 0.9992 exceeds 1 - eps: clipped at the upper bound too.
    beta_small = min(1 - 0.01 / ((0.01 + 25.0) / 2), 1 - 1e-3)
    assert beta_small == 1 - 1e-3
    assert m[0] == pytest.approx(beta_small * 2.0 + (1 - beta_small) * 0.1)

  @pytest.mark.parametrize('beta_2,eps', [(0.05, 1e-3), (0.3, 0.05), (0.9, 1e-4)])
  def test_several_steps_match_numpy(self, beta_2, eps):
    rng = np.random.default_rng(7)
    shapes = [(3, 2), (4,), ()]
    weights = [rng.normal(size=s).astype(np.float32) for s in shapes]
    steps = [[rng.normal(size=s).astype(np.float32) for s in shapes]
             for _ in range(6)]
    state, w = _run(
        build_fedadamom(0.7, beta_2=beta_2, epsilon=eps),
        [tf.constant(x) for x in weights],
        [[tf.constant(g) for g in gs] for gs in steps],
    )
    w_ref, m_ref, v_ref = numpy_fedadamom(weights, steps, 0.7, beta_2, eps)
    for got, want in zip(w, w_ref):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(state[fedadamom.ACCUMULATOR_KEY], m_ref):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(state[fedadamom.PRECONDITIONER_KEY], v_ref):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

  def test_vbar_is_one_scalar_across_tensors(self):
    # Per-tensor means would give beta1 = 0 everywhere (each tensor uniform);
    # the global mean gives the small tensor long memory.
    opt = build_fedadamom(1.0, beta_2=0.0, epsilon=1e-3)
    state, _ = _run(
        opt, [tf.zeros(2), tf.zeros(2)],
        [[tf.constant([1.0, 1.0]), tf.constant([3.0, 3.0])]] * 2,
    )
    # vbar = (1 + 9) / 2 = 5 -> beta1 = 0.8 for the small tensor, 0 for the big.
    # Step 1: m = 0.2 * 1; step 2: m = 0.8 * 0.2 + 0.2 * 1 = 0.36.
    np.testing.assert_allclose(
        state[fedadamom.ACCUMULATOR_KEY][0], [0.36, 0.36], rtol=1e-6
    )
    np.testing.assert_allclose(
        state[fedadamom.ACCUMULATOR_KEY][1], [3.0, 3.0], rtol=1e-6
    )

  def test_all_zero_update_is_finite(self):
    opt = build_fedadamom()
    state, w = _run(opt, [tf.ones([2, 2])], [[tf.zeros([2, 2])]] * 3)
    np.testing.assert_array_equal(w[0], np.ones([2, 2]))
    assert np.all(np.isfinite(state[fedadamom.ACCUMULATOR_KEY][0]))

  def test_epsilon_one_is_sgd_exactly(self):
    rng = np.random.default_rng(3)
    w0 = [tf.constant(rng.normal(size=(5, 3)), tf.float32),
          tf.constant(rng.normal(size=(3,)), tf.float32)]
    steps = [[tf.constant(rng.normal(size=t.shape), tf.float32) for t in w0]
             for _ in range(5)]
    _, w_adamom = _run(build_fedadamom(0.3, beta_2=0.1, epsilon=1.0), w0, steps)
    _, w_sgd = _run(tff.learning.optimizers.build_sgdm(0.3), w0, steps)
    for a, b in zip(w_adamom, w_sgd):
      np.testing.assert_array_equal(a, b)


class TestStructures:

  @pytest.mark.parametrize(
      'weights',
      [
          tf.constant(1.5),
          tf.constant([1.0, -2.0, 3.0]),
          collections.OrderedDict(
              a=[tf.ones([2, 2]), tf.ones([3])],
              b=collections.OrderedDict(c=tf.ones([]))),
          [],
          (),
          collections.OrderedDict(),
      ],
      ids=['scalar', 'flat', 'nested', 'empty_list', 'empty_tuple', 'empty_dict'],
  )
  def test_structures(self, weights):
    grads = tf.nest.map_structure(lambda t: 0.5 * tf.ones_like(t), weights)
    state, new = _run(build_fedadamom(), weights, [grads, grads])
    tf.nest.assert_same_structure(new, weights)
    tf.nest.assert_same_structure(state[fedadamom.ACCUMULATOR_KEY], weights)
    for leaf in tf.nest.flatten(new):
      assert np.all(np.isfinite(leaf))

  def test_mixed_dtypes(self):
    weights = [tf.ones([3], tf.float32), tf.ones([2], tf.float64),
               tf.ones([4], tf.bfloat16)]
    grads = [tf.constant([1.0, 2.0, 3.0], tf.float32),
             tf.constant([4.0, 5.0], tf.float64),
             tf.constant([0.5, 1.0, 1.5, 2.0], tf.bfloat16)]
    state, new = _run(build_fedadamom(), weights, [grads, grads])
    assert [t.dtype for t in new] == [tf.float32, tf.float64, tf.bfloat16]
    assert [t.dtype for t in state[fedadamom.PRECONDITIONER_KEY]] == [
        tf.float32, tf.float64, tf.bfloat16]
    w_ref, _, _ = numpy_fedadamom(
        [np.ones(3), np.ones(2), np.ones(4)],
        [[g.numpy().astype(np.float64) for g in grads]] * 2, 1.0, 0.05, 1e-3)
    # The bf16 leaf's v (8 mantissa bits) enters the shared vbar, so every leaf
    # carries bf16-level error in its beta1; the bf16 weights carry their own.
    for got, want, tol in zip(new, w_ref, [1e-3, 1e-3, 3e-2]):
      np.testing.assert_allclose(
          tf.cast(got, tf.float64), want, rtol=tol, atol=tol)

  def test_bfloat16_mean_is_reduced_in_float32(self):
    # 4096 equal elements: a bf16 running sum would stall (8 mantissa bits),
    # making vbar too small and every beta1 0. In float32 beta1 ends at 0.
    n = 4096
    weights = [tf.zeros([n], tf.bfloat16), tf.zeros([1], tf.float32)]
    grads = [tf.ones([n], tf.bfloat16), tf.zeros([1], tf.float32)]
    state, _ = _run(build_fedadamom(beta_2=0.0), weights, [grads])
    np.testing.assert_allclose(
        tf.cast(state[fedadamom.ACCUMULATOR_KEY][0], tf.float32),
        np.ones(n), rtol=1e-2)

  def test_none_gradients(self):
    opt = build_fedadamom(1.0, beta_2=0.0)
    weights = [tf.ones([2]), tf.ones([2])]
    state, new = _run(opt, weights, [[tf.constant([1.0, 3.0]), None]] * 2)
    np.testing.assert_array_equal(new[1], [1.0, 1.0])
    np.testing.assert_array_equal(state[fedadamom.ACCUMULATOR_KEY][1], [0, 0])
    np.testing.assert_array_equal(state[fedadamom.PRECONDITIONER_KEY][1], [0, 0])
    # vbar over the first tensor only: v = [1, 9], vbar = 5.
    w_ref, _, _ = numpy_fedadamom([np.ones(2)], [[np.array([1.0, 3.0])]] * 2,
                                  1.0, 0.0, 1e-3)
    np.testing.assert_allclose(new[0], w_ref[0], rtol=1e-6)

  def test_indexed_slices(self):
    dense = tf.constant([[1.0, 2.0], [0.0, 0.0], [3.0, 4.0]])
    sparse = tf.IndexedSlices(
        values=tf.constant([[1.0, 2.0], [3.0, 4.0]]),
        indices=tf.constant([0, 2]),
        dense_shape=tf.constant([3, 2]))
    opt = build_fedadamom()
    _, w_dense = _run(opt, [tf.zeros([3, 2])], [[dense]] * 2)
    _, w_sparse = _run(opt, [tf.zeros([3, 2])], [[sparse]] * 2)
    np.testing.assert_allclose(w_sparse[0], w_dense[0])


def test_convergence_on_ill_conditioned_quadratic():
  # f(w) = 0.5 * sum(h_i * w_i^2), condition number 100.
  h = tf.constant([100.0, 10.0, 1.0])
  w = tf.constant([1.0, 1.0, 1.0])
  opt = build_fedadamom(0.015, beta_2=0.1)
  state = opt.initialize(tf.TensorSpec([3], tf.float32))
  loss0 = float(0.5 * tf.reduce_sum(h * w * w))
  for _ in range(400):
    state, w = opt.next(state, w, h * w)
  loss = float(0.5 * tf.reduce_sum(h * w * w))
  assert loss < 1e-3 * loss0


class TestExecution:

  def _inputs(self):
    rng = np.random.default_rng(0)
    w = [tf.constant(rng.normal(size=(4, 3)), tf.float32),
         tf.constant(rng.normal(size=(3,)), tf.float32)]
    steps = [[tf.constant(rng.normal(size=t.shape), tf.float32) for t in w]
             for _ in range(3)]
    return w, steps

  def test_eager_tf_computation_and_federated_agree(self):
    opt = build_fedadamom(0.5, beta_2=0.1)
    w0, steps = self._inputs()
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in w0]
    _, eager_w = _run(opt, w0, steps)

    @tff.tensorflow.computation
    def init_fn():
      return opt.initialize(specs)

    state_type = init_fn.type_signature.result
    weights_type = tff.types.tensorflow_to_type(specs)

    @tff.tensorflow.computation(state_type, weights_type, weights_type)
    def next_fn(state, weights, grads):
      return opt.next(state, weights, grads)

    @tff.federated_computation(
        tff.FederatedType(state_type, tff.SERVER),
        tff.FederatedType(weights_type, tff.SERVER),
        tff.FederatedType(weights_type, tff.SERVER),
    )
    def federated_next(state, weights, grads):
      return tff.federated_map(
          next_fn, tff.federated_zip((state, weights, grads)))

    state_c, w_c = init_fn(), [t.numpy() for t in w0]
    state_f, w_f = init_fn(), [t.numpy() for t in w0]
    for grads in steps:
      g = [t.numpy() for t in grads]
      state_c, w_c = next_fn(state_c, w_c, g)
      state_f, w_f = federated_next(state_f, w_f, g)
    for a, b, c in zip(eager_w, w_c, w_f):
      np.testing.assert_allclose(a, b, rtol=1e-6)
      np.testing.assert_allclose(a, c, rtol=1e-6)
    # The state keeps its structure and dtypes through TFF.
    assert list(state_c) == list(init_fn())
    assert state_type.is_equivalent_to(
        tff.types.tensorflow_to_type(
            tf.nest.map_structure(
                lambda x: tf.TensorSpec(np.shape(x), tf.as_dtype(np.asarray(x).dtype)),
                state_c)))


class TestHparams:

  def test_round_trip(self):
    opt = build_fedadamom(0.5, beta_2=0.2, epsilon=0.01)
    state = opt.initialize([tf.TensorSpec([2], tf.float32)])
    hparams = opt.get_hparams(state)
    assert hparams == collections.OrderedDict(
        [(LR_KEY, 0.5), ('beta_2', 0.2), ('epsilon', 0.01)])
    new = opt.set_hparams(state, collections.OrderedDict(
        learning_rate=0.1, beta_2=0.3, epsilon=0.5))
    assert opt.get_hparams(new) == collections.OrderedDict(
        [(LR_KEY, 0.1), ('beta_2', 0.3), ('epsilon', 0.5)])
    assert list(new) == list(state)
    assert opt.set_hparams(new, hparams) == state or all(
        np.array_equal(a, b) for a, b in zip(
            tf.nest.flatten(opt.set_hparams(new, hparams)),
            tf.nest.flatten(state)))

  def test_set_unknown_hparam(self):
    opt = build_fedadamom()
    state = opt.initialize([tf.TensorSpec([2], tf.float32)])
    with pytest.raises(ValueError, match='beta_1'):
      opt.set_hparams(state, {'beta_1': 0.9})

  def test_tensor_hparams(self):
    opt = build_fedadamom(tf.constant(0.5), tf.constant(0.1), tf.constant(0.01))
    _, w = _run(opt, [tf.ones(2)], [[tf.constant([1.0, 2.0])]])
    assert np.all(np.isfinite(w[0]))

  def test_schedule_learning_rate(self):
    opt = tff.learning.optimizers.schedule_learning_rate(
        build_fedadamom(1.0, epsilon=1.0), lambda r: 0.5 ** tf.cast(r, tf.float32))
    state = opt.initialize([tf.TensorSpec([1], tf.float32)])
    w = [tf.constant([0.0])]
    for _ in range(3):
      state, w = opt.next(state, w, [tf.constant([1.0])])
    # epsilon = 1 -> SGD: w = -(1 + 0.5 + 0.25).
    np.testing.assert_allclose(w[0], [-1.75], rtol=1e-6)


@pytest.mark.parametrize(
    'kwargs,name',
    [
        (dict(learning_rate=-0.1), 'learning_rate'),
        (dict(beta_2=-0.01), 'beta_2'),
        (dict(beta_2=1.5), 'beta_2'),
        (dict(epsilon=0.0), 'epsilon'),
        (dict(epsilon=1.5), 'epsilon'),
        (dict(epsilon=-1e-3), 'epsilon'),
        (dict(beta_2=tf.constant(2.0)), 'beta_2'),
        (dict(learning_rate=float('nan')), 'learning_rate'),
    ],
)
def test_invalid_args(kwargs, name):
  with pytest.raises(ValueError, match=rf'`{name}`.*found'):
    build_fedadamom(**kwargs)
