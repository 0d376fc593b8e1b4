"""Long-context evaluation: peak memory (RSS) and time of a forward pass, dense vs blockwise.

Run:  .venv/bin/python benchmarks/long_context.py
      (--lengths 1024,2048,4096,8192,16384,32768 --encodings bipe_rope,bipe_alibi,dape_kerple
       --impls dense,blockwise --block_size 512 --max_dense_gib 6)

Each (encoding, attention path, length) point runs in a fresh subprocess (`--child`), so
its peak resident set size (ru_maxrss) is its own. The child builds the tiny preset's
model (random weights), then runs a jitted evaluation forward on one row of the given
length -- logits and the mean next-token NLL, as perplexity evaluation does -- once to
compile and `--repeats` times to time it. It reports the RSS after setup (JAX runtime +
params + compiled code), the peak RSS, and the median forward time.

Dense attention materialises several [H, T, T] float32 arrays per layer (DAPE also its
[dape_hidden, T, T] hidden activations and their gradients' buffers); points whose estimate (`dense_estimate_gib`) exceeds
`--max_dense_gib` are skipped and marked so (at 32k tokens one [4, T, T] array is 16 GiB). The blockwise path's memory must grow
linearly with T: the table's last column is the peak-RSS growth per 1k tokens between
consecutive lengths, which is flat when growth is linear.

Tokens are random ids with a separator every 20-100 tokens (realistic segment lengths for
the bilevel streams; the learned intra table clamps long segments anyway).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=g-import-not-at-top


def dense_estimate_gib(config, length: int) -> float:
  """Rough peak of dense attention: 3 [H, T, T] float32 arrays, plus for DAPE schemes about
  6 [dape_hidden, T, T] ones (calibrated on this machine: dape_kerple, tiny, 4k tokens peaked
  at 13.7 GiB; bipe_rope at 8k at 3.5 GiB)."""
  channels = 3 * int(config.model.num_heads)
  if 'dape' in config.model.position_encoding:
    channels += 6 * int(config.model.dape_hidden)
  return channels * length ** 2 * 4 / 2 ** 30


def child(encoding: str, impl: str, length: int, block_size: int, repeats: int,
          preset: str) -> dict:
  """Runs in the subprocess: one forward configuration; returns its measurements."""
  import time  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from benchmarks import jax_step  # pylint: disable=g-import-not-at-top
  from bipe_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax import model as model_lib  # pylint: disable=g-import-not-at-top

  config = jax_step.load_config(preset, {
      'model.position_encoding': encoding, 'model.attention_impl': impl,
      'model.block_size': block_size})
  mc = config_lib.model_config_from_dict(config.model)
  model = model_lib.Transformer(mc)
  rng = np.random.default_rng(0)
  tokens = rng.integers(100, mc.vocab_size, size=(1, length), dtype=np.int32)
  at = 0
  while True:
    at += int(rng.integers(20, 101))
    if at >= length:
      break
    tokens[0, at] = jax_step.SEPARATOR_IDS[0]
  tokens = jnp.asarray(tokens)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens[:, :8])['params']

  @jax.jit
  def forward_nll(params, tokens_BxT):
    logits = model.apply({'params': params}, tokens_BxT)[:, :-1]
    lse = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, tokens_BxT[:, 1:, None], axis=-1)[..., 0]
    return jnp.mean(lse - tgt)

  compiled = forward_nll.lower(params, tokens).compile()
  setup_rss = common.current_rss_bytes()
  start = time.perf_counter()
  nll = float(compiled(params, tokens))
  first = time.perf_counter() - start
  times = [first] + [common.time_once(lambda: compiled(params, tokens))
                     for _ in range(repeats - 1)]
  return {'encoding': encoding, 'impl': impl, 'length': length, 'nll': nll,
          'setup_rss': setup_rss, 'peak_rss': common.peak_rss_bytes(),
          'forward_s': common.median(times), 'times': times}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--lengths', default='1024,2048,4096,8192,16384,32768')
  p.add_argument('--encodings', default='bipe_rope,bipe_alibi,dape_kerple')
  p.add_argument('--impls', default='dense,blockwise')
  p.add_argument('--block_size', type=int, default=512)
  p.add_argument('--preset', default='tiny')
  p.add_argument('--repeats', type=int, default=2)
  p.add_argument('--max_dense_gib', type=float, default=6.0)
  p.add_argument('--timeout', type=float, default=1800)
  p.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
  p.add_argument('--out', default=None)
  args = p.parse_args(argv)
  lengths = [int(x) for x in args.lengths.split(',')]
  if args.child:
    print(json.dumps(child(args.encodings, args.impls, lengths[0], args.block_size,
                           args.repeats, args.preset)), flush=True)
    return
  from benchmarks import jax_step  # pylint: disable=g-import-not-at-top
  results = []
  for enc in args.encodings.split(','):
    cfg = jax_step.load_config(args.preset, {'model.position_encoding': enc})
    for impl in args.impls.split(','):
      for t in lengths:
        est = dense_estimate_gib(cfg, t)
        if impl == 'dense' and est > args.max_dense_gib:
          res = {'encoding': enc, 'impl': impl, 'length': t,
                 'skipped': f'skipped: dense estimate {est:.0f} GiB > '
                            f'{args.max_dense_gib:g} GiB'}
        else:
          res = common.run_json_subprocess(
              [os.path.abspath(__file__), '--child', '--encodings', enc, '--impls', impl,
               '--lengths', str(t), '--block_size', str(args.block_size), '--repeats',
               str(args.repeats), '--preset', args.preset], timeout=args.timeout)
          res.update({'encoding': enc, 'impl': impl, 'length': t})
        results.append(res)
        print(json.dumps({k: v for k, v in res.items() if k != 'times'}), file=sys.stderr,
              flush=True)
  rows = []
  prev = {}
  for r in results:
    key = (r['encoding'], r['impl'])
    if 'peak_rss' not in r:
      rows.append([r['encoding'], r['impl'], r['length'], '-', '-', '-',
                   r.get('skipped') or r.get('error', '?')])
      continue
    growth = ''
    if key in prev:
      pt, prss = prev[key]
      growth = f'{(r["peak_rss"] - prss) / 2 ** 20 / ((r["length"] - pt) / 1024):.1f}'
    prev[key] = (r['length'], r['peak_rss'])
    rows.append([r['encoding'], r['impl'], r['length'], f'{r["forward_s"]:.2f}',
                 f'{r["setup_rss"] / 2 ** 20:.0f}', f'{r["peak_rss"] / 2 ** 20:.0f}', growth])
  table = common.markdown_table(
      ['encoding', 'attention', 'tokens', 'forward (s)', 'RSS after setup (MiB)',
       'peak RSS (MiB)', 'peak growth (MiB per 1k tokens)'], rows)
  common.report(f'Long-context forward ({args.preset} model, batch 1, block '
                f'{args.block_size})', table, out=args.out, data=results)


if __name__ == '__main__':
  main()
