"""A batch of prompts of different lengths (left padding) decodes exactly as each prompt alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import generation
from tests.model.test_generation import _tiny_model
from tests.scheme_cover import HOOK_COVER

# Separators (2, 3) inside the prompts, so bilevel positions matter; lengths 7, 3 and 5.
PROMPTS = [[4, 5, 2, 6, 7, 7, 3], [6, 2, 4], [1, 5, 3, 3, 6]]
PAD = 5  # a real token id: the mask, not the id, makes a slot padding


def test_left_pad_by_hand():
  tokens, valid = generation.left_pad([[1, 2, 3], [4]], pad_value=9)
  np.testing.assert_array_equal(tokens, [[1, 2, 3], [9, 9, 4]])
  np.testing.assert_array_equal(valid, [[True, True, True], [False, False, True]])
  with pytest.raises(ValueError, match='at least one token'):
    generation.left_pad([[1], []])


@pytest.mark.parametrize('name', HOOK_COVER)
def test_padded_batch_decodes_as_each_prompt_alone(name):
  """The left-padded batch's greedy continuation and logits equal those of each prompt alone,
  computed without padding and without a cache: one full forward of the row (the prompt and
  the tokens the batch generated for it) gives the logits each generated token was drawn from
  and, by its argmax, the greedy token. The rows are right-filled to one length for a single
  compile: a causal model's logits do not depend on later tokens (test_model.py checks that for
  every scheme). test_generation.py checks cached decoding of one prompt against the full
  forward for the same schemes."""
  model, params = _tiny_model(name)
  tokens, valid = generation.left_pad(PROMPTS, pad_value=PAD)
  new = 6
  batched, batched_logits = generation.generate(model, params, tokens, max_new_tokens=new,
                                                return_logits=True, prompt_valid_BxP=valid)
  np.testing.assert_array_equal(batched[:, :tokens.shape[1]], tokens)
  generated = np.asarray(batched[:, tokens.shape[1]:])
  longest = max(map(len, PROMPTS)) + new
  alone = np.full((len(PROMPTS), longest), PAD, np.int32)  # each row unpadded on the left
  for i, prompt in enumerate(PROMPTS):
    alone[i, :len(prompt) + new] = [*prompt, *generated[i]]
  forward = np.asarray(jax.jit(lambda t: model.apply({'params': params}, t))(alone))
  for i, prompt in enumerate(PROMPTS):
    drawn_from = forward[i, len(prompt) - 1:len(prompt) - 1 + new]  # [new, V]
    np.testing.assert_allclose(batched_logits[i], drawn_from, atol=2e-5, rtol=2e-5)
    np.testing.assert_array_equal(generated[i], np.argmax(drawn_from, axis=-1))


@pytest.mark.parametrize('name', ['bipe_rope', 'bipe_alibi', 'fire'])
def test_a_validity_mask_makes_padding_invisible_in_a_full_forward(name):
  model, params = _tiny_model(name)
  # jitted: a whole-model forward run eagerly dispatches every operation on its own (4x slower)
  apply = jax.jit(lambda tokens_BxT, valid_BxT=None: model.apply(
      {'params': params}, tokens_BxT, valid_BxT=valid_BxT))
  tokens, valid = generation.left_pad(PROMPTS, pad_value=PAD)
  padded = np.asarray(apply(jnp.asarray(tokens), jnp.asarray(valid)))
  for i, prompt in enumerate(PROMPTS):
    alone = np.asarray(apply(jnp.asarray([prompt], jnp.int32)))
    np.testing.assert_allclose(padded[i, tokens.shape[1] - len(prompt):], alone[0],
                               atol=2e-5, rtol=2e-5)
  # Without the mask the padding ids are ordinary tokens: the short rows change.
  unmasked = np.asarray(apply(jnp.asarray(tokens)))
  assert not np.allclose(unmasked[1, -3:], padded[1, -3:], atol=1e-3)


def test_padding_that_is_not_on_the_left_is_refused():
  model, params = _tiny_model('rope')
  tokens, valid = generation.left_pad(PROMPTS, pad_value=PAD)
  with pytest.raises(ValueError, match='left padding'):
    generation.generate(model, params, tokens, max_new_tokens=2,
                        prompt_valid_BxP=valid[:, ::-1])
  with pytest.raises(ValueError, match='shape'):
    generation.generate(model, params, tokens, max_new_tokens=2, prompt_valid_BxP=valid[:, 1:])
