"""The README's examples of the encodings in your own model (linen and NNX) run as written, so
they cannot rot."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
from tests import fixtures

README = os.path.join(fixtures.ROOT, 'README.md')


def _example_code(heading: str) -> str:
  """The first python block after `heading` inside the README's section on your own model."""
  text = open(README).read()
  section = text.split('## Using the encodings in your own model', 1)[1].split('\n## ', 1)[0]
  match = re.search(r'```python\n(.*?)```', section.split(heading, 1)[1], re.S)
  assert match, f'README has no python example under {heading!r}'
  return match.group(1)


def _run(heading: str) -> dict:
  namespace = {}
  exec(compile(_example_code(heading), 'README.md', 'exec'), namespace)  # pylint: disable=exec-used
  return namespace


def test_readme_linen_example_runs():
  namespace = _run('### Flax linen')
  out = namespace['out']
  assert out.shape == (1, 8, 32)
  # The example is causal: the first output rows depend only on the first tokens.
  tokens2 = namespace['tokens'].at[0, 5:].set(9)
  out2 = namespace['layer'].apply(namespace['params'], namespace['x'], tokens2)
  assert abs(float((out2[0, :5] - out[0, :5]).max())) < 1e-6


def test_readme_nnx_example_runs():
  namespace = _run('### Flax NNX')
  layer, tokens, out = namespace['layer'], namespace['tokens'], namespace['out']
  x = jnp.ones((1, 8, 32))
  np.testing.assert_allclose(layer(x, tokens), out)
  # Causal, and BiPE: moving a separator (id 3) changes the rows after it, not those before.
  moved = layer(x, tokens.at[0, 2].set(5))
  np.testing.assert_allclose(moved[0, :2], out[0, :2], atol=1e-6)
  assert not np.allclose(moved[0, 3:], out[0, 3:], atol=1e-4)
  # The whole decoder from NNX: logits, a finite loss and a gradient for every parameter.
  model, loss, grads = namespace['model'], namespace['loss'], namespace['grads']
  assert model(tokens).shape == (1, 8, 16)
  assert np.isfinite(float(loss)) and float(loss) > 0
  assert all(float(jnp.abs(g).sum()) > 0 for g in jax.tree.leaves(grads))
