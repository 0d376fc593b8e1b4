"""Pictures of what a run learned (eval/visualize.py): the positional bias of one query over all
keys, static and (for DAPE) adapted to the text, as in DAPE's Figure 1; and the attention map of
one layer and head on a real text window. PNGs plus the numbers as JSON.

The window is the first `query + 1` tokens of the run's validation split; the query is its last
token (default: position 16 x the training length - 1, so the window is 16x the training length).
  bias.png       bias over the keys against the distance q - k (log axis), every head: the static
                 bias B (ALiBi / Kerple / FIRE / T5 on the scheme's stream), and for DAPE the
                 adapted bias A - S = B + f(S, B) (solid: static, dashed: adapted);
  attention.png  the chosen layer and head's attention probabilities over the window (log colour
                 scale), and the query's row against the distance (log axes);
  visualize.json the numbers drawn: per head static / adapted bias of the query's row, its
                 attention row, and the window's token ids.
Logits come from bipe_jax/evaluation/attention_probe.py (the model's own modules and params).
"""

from __future__ import annotations

import numpy as np

from bipe_jax import storage
from bipe_jax.evaluation import attention_probe


def default_query(train_length: int, multiple: int = 16) -> int:
  """The query position of `multiple` x the training length (0-based: the window's last)."""
  return multiple * train_length - 1


def query_numbers(probe: dict, query: int, head: int) -> dict:
  """The numbers of one query's row: static bias [H][q+1] (None without a bias), adapted bias
  [H][q+1] (None without a transform), the head's attention row [q+1] and scores [H][q+1]."""
  row = lambda a: a[0, :, query, :query + 1]
  num_heads = probe['scores'].shape[1]
  if not 0 <= head < num_heads:
    raise ValueError(f'--head={head}: the model has heads 0..{num_heads - 1}')
  has_bias = 'bias' in probe
  adapted = probe['logits'] - probe['scores']
  transformed = not np.allclose(adapted, probe['bias'] if has_bias else 0.0)
  return {
      'query': query,
      'head': head,
      'distance': list(range(query, -1, -1)),  # q - k for keys k = 0..q
      'static_bias': row(probe['bias']).tolist() if has_bias else None,
      'adapted_bias': row(adapted).tolist() if transformed else None,
      'attention_row': probe['weights'][0, head, query, :query + 1].tolist(),
  }


def draw_bias(numbers: dict, path: str, title: str) -> str:
  """bias.png: per head, the static (solid) and adapted (dashed) bias against q - k + 1."""
  from bipe_jax.evaluation import plot  # pylint: disable=g-import-not-at-top (Agg backend)
  plt = plot.plt
  fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
  x = np.asarray(numbers['distance']) + 1
  static, adapted = numbers['static_bias'], numbers['adapted_bias']
  if static is None and adapted is None:
    ax.text(0.5, 0.5, 'this scheme has no additive positional bias', ha='center',
            transform=ax.transAxes)
  for h in range(len(static or adapted or [])):
    colour = f'C{h}'
    if static is not None:
      ax.plot(x, static[h], color=colour, linewidth=1.2, label=f'head {h} static')
    if adapted is not None:
      ax.plot(x, adapted[h], color=colour, linewidth=0.8, linestyle='--', alpha=0.8,
              label=f'head {h} adapted (DAPE)')
  ax.set_xscale('log')
  ax.set_xlabel('distance to the query q - k + 1 (log scale)')
  ax.set_ylabel('bias added to the attention logit')
  ax.set_title(title, fontsize=9)
  ax.grid(True, which='both', alpha=0.3)
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=6, ncol=2)
  fig.tight_layout()
  storage.save_figure(fig, path)
  plt.close(fig)
  return path


def draw_attention(weights_TxT: np.ndarray, numbers: dict, path: str, title: str) -> str:
  """attention.png: the map (log colour scale) and the query's row against the distance."""
  from matplotlib import colors  # pylint: disable=g-import-not-at-top
  from bipe_jax.evaluation import plot  # pylint: disable=g-import-not-at-top (Agg backend)
  plt = plot.plt
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.4), dpi=120)
  w = np.where(np.tril(np.ones_like(weights_TxT, bool)), weights_TxT, np.nan)
  floor = max(float(np.nanmin(w[w > 0])) if np.any(w > 0) else 1e-9, 1e-9)
  image = left.imshow(np.maximum(w, floor), norm=colors.LogNorm(vmin=floor, vmax=1.0),
                      cmap='viridis', interpolation='nearest')
  fig.colorbar(image, ax=left, fraction=0.046, label='attention probability (log)')
  left.set_xlabel('key position')
  left.set_ylabel('query position')
  left.set_title(title, fontsize=9)
  x = np.asarray(numbers['distance']) + 1
  right.plot(x, np.maximum(numbers['attention_row'], floor), linewidth=0.8)
  right.set_xscale('log')
  right.set_yscale('log')
  right.set_xlabel('distance to the query q - k + 1 (log scale)')
  right.set_ylabel('attention probability (log scale)')
  right.set_title(f'query {numbers["query"]}, head {numbers["head"]}', fontsize=9)
  right.grid(True, which='both', alpha=0.3)
  fig.tight_layout()
  storage.save_figure(fig, path)
  plt.close(fig)
  return path


def visualize(model_config, params, tokens_T, *, query: int, layer: int, head: int,
              output_dir: str, label: str, train_length: int) -> dict:
  """Draws bias.png and attention.png and writes visualize.json in `output_dir` for the window
  `tokens_T` [query + 1]; returns the JSON document (with the paths written)."""
  tokens_T = np.asarray(tokens_T)
  if tokens_T.ndim != 1 or tokens_T.shape[0] != query + 1:
    raise ValueError(f'the window must hold query + 1 = {query + 1} tokens, got shape '
                     f'{tokens_T.shape}')
  probe = attention_probe.layer_logits(model_config, params, tokens_T[None], layer)
  numbers = query_numbers(probe, query, head)
  where = (f'{label}, layer {layer}, query {query} '
           f'({(query + 1) / train_length:g}x the training length {train_length})')
  document = {'label': label, 'encoding': model_config.position_encoding, 'layer': layer,
              'train_length': train_length, 'window_tokens': tokens_T.tolist(), **numbers,
              'bias_png': draw_bias(numbers, storage.join(output_dir, 'bias.png'),
                                    f'positional bias, {where}'),
              'attention_png': draw_attention(probe['weights'][0, head], numbers,
                                              storage.join(output_dir, 'attention.png'),
                                              f'attention, {label}, layer {layer}, '
                                              f'head {head}')}
  storage.write_json(storage.join(output_dir, 'visualize.json'), document, indent=None)
  return document


def visualize_run(workdir: str, *, query: int = 0, layer: int = -1, head: int = 0,
                  output_dir: str = '', step: int | None = None) -> dict:
  """`visualize` for a training workdir: its params, its validation text; query 0 = the
  default (16x the training length), layer -1 = the last; output_dir '' = <workdir>/visualize."""
  from bipe_jax import data  # pylint: disable=g-import-not-at-top
  from bipe_jax.runs import restore as runs_lib  # pylint: disable=g-import-not-at-top
  run = runs_lib.load_run(workdir, step=step, attention_impl='dense')
  query = query or default_query(run.train_length)
  layer = layer if layer >= 0 else run.model_config.num_layers + layer
  tokens, _ = data.make_eval_blocks(run.config.data, query + 1, max_tokens=query + 1)
  import jax  # pylint: disable=g-import-not-at-top
  return visualize(run.model_config, jax.device_get(run.params), tokens[0], query=query,
                   layer=layer, head=head, output_dir=output_dir or storage.join(workdir, 'visualize'),
                   label=f'{run.encoding} step {run.step}', train_length=run.train_length)
