"""AdamW with warmup then linear (the paper's) or cosine decay, global-norm clipping and
weight decay on matrices only (norm scales and other vectors are not decayed).

Gradient accumulation is done inside the train step (a scan over micro-batches, see
`train_step.py`), so the optimizer sees one update per step and its schedule counts steps.
bfloat16 compute with float32 master weights is `model.dtype='bfloat16'`: parameters, and
so the optimizer state, stay float32.
"""

import jax
import jax.numpy as jnp
import optax

from bipe_jax import run_config as run_config_lib

SCHEDULES = run_config_lib.SCHEDULES


def _typed(train_config) -> run_config_lib.TrainConfig:
  """A TrainConfig as it is; a config.train section (ConfigDict or dict) validated into one."""
  if isinstance(train_config, run_config_lib.TrainConfig):
    return train_config
  return run_config_lib.section_from_dict('train', train_config)


def learning_rate_schedule(train_config) -> optax.Schedule:
  """lr(step) for the update that produces step `step + 1` (step counts from 0).

  Warmup: lr * (step + 1) / warmup_steps for step < warmup_steps (the first update is not
  zero). Then decay to `end_learning_rate_ratio * lr` at `train.steps`: linear (polynomial
  power 1, as the paper) or cosine. Constant after `train.steps`. `train_config`: a
  TrainConfig (bipe_jax/run_config.py) or a config.train section.
  """
  t = _typed(train_config)
  peak = float(t.learning_rate)
  warmup = int(t.warmup_steps)
  total = int(t.steps)
  end = peak * float(t.end_learning_rate_ratio)
  kind = t.schedule

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warm = peak * jnp.minimum(1.0, (step + 1.0) / max(warmup, 1))
    frac = jnp.clip((step - warmup) / max(total - warmup, 1), 0.0, 1.0)
    if kind == 'linear':
      decayed = peak + (end - peak) * frac
    elif kind == 'cosine':
      decayed = end + 0.5 * (peak - end) * (1.0 + jnp.cos(jnp.pi * frac))
    else:
      decayed = jnp.asarray(peak, jnp.float32)
    return jnp.where(step < warmup, warm, decayed)

  return schedule


def decay_mask(params):
  """True for parameters that get weight decay: matrices and embedding tables (ndim >= 2)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def _is_kerple_param(path) -> bool:
  from bipe_jax.encodings import kerple  # pylint: disable=g-import-not-at-top
  names = [str(getattr(k, 'key', getattr(k, 'name', k))) for k in path]
  return len(names) >= 2 and names[-2] == 'kerple' and names[-1] in kerple.KERPLE_PARAM_NAMES


def project_parameters(params):
  """The parameters after an update, with every Kerple `p` / `a` projected back to >= 0.01 (the
  official code's projection; bipe_jax.encodings.kerple). Other parameters are returned as is.
  Applied by the train step after `optax.apply_updates`, outside the optimizer, so the
  optimizer state (and so checkpoints) do not change."""
  from bipe_jax.encodings import kerple  # pylint: disable=g-import-not-at-top
  return jax.tree_util.tree_map_with_path(
      lambda path, p: jnp.maximum(p, kerple.KERPLE_MIN) if _is_kerple_param(path) else p, params)


def make_optimizer(train_config) -> optax.GradientTransformation:
  """Clip by global norm (if grad_clip > 0), then AdamW with the schedule above.
  `train_config`: a TrainConfig or a config.train section."""
  t = _typed(train_config)
  parts = []
  if float(t.grad_clip) > 0:
    parts.append(optax.clip_by_global_norm(float(t.grad_clip)))
  parts.append(optax.adamw(
      learning_rate=learning_rate_schedule(t), b1=float(t.b1), b2=float(t.b2),
      eps=float(t.eps), weight_decay=float(t.weight_decay), mask=decay_mask))
  return optax.chain(*parts)
