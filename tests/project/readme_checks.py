"""What each Python block of README.md must have computed, keyed by the heading the block sits
under. tests/project/test_readme.py runs every block in a subprocess and then calls the check
of its heading with the block's namespace (the names it defined); a README block under a heading
without a check here still runs, and must finish without an error.
"""

import jax
import jax.numpy as jnp
import numpy as np


def linen_example(namespace: dict) -> None:
  out = namespace['out']
  assert out.shape == (1, 8, 32), out.shape
  # The example is causal: the first output rows depend only on the first tokens.
  tokens2 = namespace['tokens'].at[0, 5:].set(9)
  out2 = namespace['layer'].apply(namespace['params'], namespace['x'], tokens2)
  np.testing.assert_allclose(out2[0, :5], out[0, :5], atol=1e-6)
  assert not np.allclose(out2[0, 5:], out[0, 5:], atol=1e-4)


def nnx_example(namespace: dict) -> None:
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


def generation_example(namespace: dict) -> None:
  """The README's claim: prompts of different lengths, left-padded, each continue exactly as
  they would alone (greedy decoding)."""
  generation, run = namespace['generation'], namespace['run']
  out = np.asarray(namespace['out'])
  assert out.shape == (2, 3 + 32), out.shape
  np.testing.assert_array_equal(out[0, :3], [1, 17, 42])
  np.testing.assert_array_equal(out[1, 1:3], [1, 5])
  assert ((out >= 0) & (out < run.model_config.vocab_size)).all()
  with run.context():
    alone = np.asarray(generation.generate(run.model, run.params, jnp.array([[1, 5]], jnp.int32),
                                           max_new_tokens=32))
  np.testing.assert_array_equal(out[1, 3:], alone[0, 2:])


CHECKS = {
    '### Flax linen': linen_example,
    '### Flax NNX': nnx_example,
    '## Evaluation and generation': generation_example,
}


def main(blocks_json: str) -> None:
  """Runs the blocks of `blocks_json` ([{'code', 'line', 'heading'}]) in order, each in a fresh
  namespace as a script would, then the check of its heading."""
  import json  # pylint: disable=g-import-not-at-top
  with open(blocks_json, encoding='utf-8') as f:
    blocks = json.load(f)
  for block in blocks:
    namespace = {'__name__': '__main__'}
    exec(compile(block['code'], f'README.md:{block["line"]}', 'exec'), namespace)  # pylint: disable=exec-used
    check = CHECKS.get(block['heading'])
    if check:
      check(namespace)
    print(f'README.md:{block["line"]}: ran{" and checked" if check else ""}', flush=True)


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top
  main(sys.argv[1])
