"""Scoring protocols (bipe_jax/evaluation/protocols.py) and per-position losses
(block_scoring.score_blocks(per_position=True)) against a loop over the stream that follows each
protocol's definition literally, window by window and target by target."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import block_scoring
from bipe_jax import data
from bipe_jax.evaluation import position_plot
from bipe_jax.evaluation import protocols

VOCAB = 7


def _apply(params, tokens_BxL):
  """A toy model whose logits depend on the token and on its position in the window, so a
  per-position curve and the choice of windows both change the numbers: [B, L, V]."""
  table_VxV, pos_LxV = params
  length = tokens_BxL.shape[1]
  return table_VxV[tokens_BxL] + pos_LxV[None, :length]


def _params(length):
  rng = np.random.default_rng(0)
  return (jnp.asarray(rng.normal(size=(VOCAB, VOCAB)), jnp.float32),
          jnp.asarray(rng.normal(size=(length, VOCAB)), jnp.float32))


def _loop_reference(stream, length, protocol, params):
  """(summed NLL, count, per-position sums [L], per-position counts [L]) by the definitions."""
  n = len(stream)
  if protocol.kind == 'sliding':
    starts = range(0, n - length + 1, protocol.k)
    first = max(1, length - protocol.k)
  else:
    starts = range(0, (n // length) * length, length)
    first = 1 if protocol.kind == 'windows' else max(1, length - protocol.k)
  pos_sum, pos_count = np.zeros(length), np.zeros(length, np.int64)
  for start in starts:
    window = np.asarray(stream[start:start + length])
    logits = np.asarray(_apply(params, jnp.asarray(window[None])), np.float64)[0]
    for t in range(first, length):
      row = logits[t - 1]
      nll = math.log(np.exp(row - row.max()).sum()) + row.max() - row[window[t]]
      pos_sum[t] += nll
      pos_count[t] += 1
  return pos_sum.sum(), int(pos_count.sum()), pos_sum, pos_count


@pytest.mark.parametrize('text,kind,k', [('windows', 'windows', 0), ('blocks', 'windows', 0),
                                         ('last:5', 'last', 5), ('sliding:3', 'sliding', 3)])
def test_parse(text, kind, k):
  assert protocols.parse(text) == protocols.Protocol(kind, k)
  assert protocols.parse('sliding', stride=4) == protocols.Protocol('sliding', 4)


@pytest.mark.parametrize('bad', ['last', 'last:0', 'last:x', 'sliding', 'window', 'sliding:-2'])
def test_bad_protocols_name_the_value(bad):
  with pytest.raises(ValueError, match=f"--protocol='{bad}' is not valid"):
    protocols.parse(bad)


def test_sliding_stride_must_be_below_the_length():
  with pytest.raises(ValueError, match='the stride 8 must be smaller than the length 8'):
    protocols.parse('sliding:8').check_length(8)


@pytest.mark.parametrize('jit_scorer', [True, False])
@pytest.mark.parametrize('text', ['windows', 'last:5', 'last:40', 'sliding:3'])
def test_scores_equal_the_loop_reference(text, jit_scorer):
  length = 12
  stream = np.random.default_rng(1).integers(0, VOCAB, size=100).astype(np.int32)
  protocol = protocols.parse(text)
  tokens, mask = data.cut_blocks(stream, length, stride=protocols.stride(protocol))
  mask = protocols.restrict_targets(mask, protocol)
  params = _params(length)
  scorer = None
  if not jit_scorer:  # the reduction outside jit
    scorer = lambda p, t, m: block_scoring.position_nll(_apply(p, t), t, m)
  result = block_scoring.score_blocks(_apply, params, tokens, mask, batch_size=3,
                                      per_position=True, scorer=scorer)
  want_sum, want_count, want_pos, want_pos_count = _loop_reference(stream, length, protocol,
                                                                   params)
  assert result.tokens == want_count > 0
  np.testing.assert_allclose(result.nll_sum, want_sum, rtol=1e-5)
  chex.assert_shape(np.asarray(result.position_nll_sum), (length,))
  np.testing.assert_allclose(result.position_nll_sum, want_pos, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(result.position_tokens, want_pos_count)
  # The plain (not per-position) score is the same total.
  plain = block_scoring.score_blocks(_apply, params, tokens, mask, batch_size=3)
  assert plain.tokens == result.tokens and plain.position_nll is None
  np.testing.assert_allclose(plain.nll_sum, result.nll_sum, rtol=1e-5)
  means = result.to_dict()['position_nll']
  assert means[0] is None or want_pos_count[0] == 0
  for t in range(length):
    if want_pos_count[t]:
      np.testing.assert_allclose(means[t], want_pos[t] / want_pos_count[t], rtol=1e-5)


def test_last_k_hand_example():
  tokens, mask = data.cut_blocks(np.arange(12), 6)
  np.testing.assert_array_equal(protocols.restrict_targets(mask, protocols.parse('last:2')),
                                [[0, 0, 0, 0, 1, 1]] * 2)
  np.testing.assert_array_equal(protocols.restrict_targets(mask, protocols.parse('last:9')),
                                [[0, 1, 1, 1, 1, 1]] * 2)  # column 0 is never a target


def test_binned_position_loss_hand_example():
  # positions 0..7; bins of 4 per octave collapse to [1, 2), [2, 3), [3, 4), [4, 5), [5, 6),
  # [6, 8): the last bin averages positions 6 and 7 by their counts.
  sums = [0, 1, 2, 3, 4, 5, 6, 14]
  counts = [0, 1, 1, 1, 1, 1, 2, 2]
  x, y = position_plot.binned_position_loss(sums, counts)
  np.testing.assert_allclose(y, [1, 2, 3, 4, 5, 20 / 4])
  np.testing.assert_allclose(x[:5], [1, 2, 3, 4, 5])
  assert 6 < x[-1] < 7


def test_position_plot_writes_a_png(tmp_path):
  doc = {'protocol': 'windows', 'runs': [
      {'label': 'a', 'train_length': 4,
       'results': [{'length': 8, 'position_nll': [None, 1, 2, 3, 4, 5, 6, 7],
                    'position_tokens': [0, 1, 1, 1, 1, 1, 1, 1]}]}]}
  path = position_plot.plot_document_positions(doc, str(tmp_path / 'p.png'))
  assert open(path, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'
  with pytest.raises(ValueError, match='per position'):
    position_plot.plot_document_positions({'runs': [{'label': 'a', 'results': [{}]}]},
                                          str(tmp_path / 'q.png'))


def test_perplexity_cli_last_k_per_position(tmp_path):
  """eval/perplexity.py's logic end to end on a saved run: last:4 scores only the last 4
  positions of each window, the JSON holds the per-position curve, the plot is written."""
  import json  # pylint: disable=g-import-not-at-top
  from bipe_jax.evaluation import cli  # pylint: disable=g-import-not-at-top
  from tests.evaluation import test_evaluation_runs as run_fixtures  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / 'run')
  run_fixtures._write_workdir(path, 'alibi')  # pylint: disable=protected-access
  out, png = str(tmp_path / 'r.json'), str(tmp_path / 'positions.png')
  assert cli.perplexity_main(workdirs=[path], lengths='16', protocol='last:4', max_tokens=160,
                             per_position=True, output=out, position_plot=png) == 0
  doc = json.load(open(out))
  assert doc['protocol'] == 'last:4'
  result, = doc['runs'][0]['results']
  counts = result['position_tokens']
  assert len(counts) == 16 and counts[:12] == [0] * 12 and min(counts[12:]) > 0
  assert result['tokens'] == sum(counts)
  np.testing.assert_allclose(
      sum(m * c for m, c in zip(result['position_nll'][12:], counts[12:])), result['nll_sum'],
      rtol=1e-6)
  assert open(png, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'
  assert cli.perplexity_main(workdirs=[path], lengths='16', protocol='last:x', output='') == 2
