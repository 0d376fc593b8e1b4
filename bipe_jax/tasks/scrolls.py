"""SCROLLS-style fine-tuning data: input -> output examples, the loss on the output only.

Examples have the SCROLLS fields `id`, `pid`, `input`, `output` (tensorflow-datasets'
`scrolls/<subset>` builder: qasper, quality, narrative_qa, qmsum, contract_nli, gov_report,
summ_screen_fd). They are read from
  * `data.scrolls_jsonl`: a folder with `<split>.jsonl` (one example per line, those fields), or
  * a prepared TFDS data_dir: `tfds.builder('scrolls/<data.scrolls_subset>', data_dir=...)`
    (this machine cannot download it: a clear error names the `tfds build` command).
A training row is `<bos> input' SEPARATOR output <eos>` padded to data.seq_len, with
`loss_mask` True on `output <eos>` only; input' is the input's tokens truncated to fit
(`data.scrolls_truncate`: 'end' keeps the beginning, 'front' keeps the end, 'middle' keeps both
ends, as the SCROLLS baselines truncate long inputs). The tokenizer is a SentencePiece file
(`data.tokenizer_path`, e.g. the one pinned in the run being fine-tuned); positions and
separators are the model's own. The task registers `data.dataset='scrolls'`.
"""

from __future__ import annotations

import json
import os

import grain
import numpy as np

from bipe_jax import storage
from bipe_jax.data import generated
from bipe_jax.data import tokenizer as tokenizer_lib

DATASET_NAME = 'scrolls'
SUBSETS = ('qasper', 'quality', 'narrative_qa', 'qmsum', 'contract_nli', 'gov_report',
           'summ_screen_fd')
SEPARATOR = '\n\nAnswer:'
TRUNCATIONS = ('end', 'front', 'middle')
FIELDS = ('id', 'input', 'output')


def settings(data_config) -> dict:
  get = data_config.get
  s = dict(subset=str(get('scrolls_subset', 'qasper')), jsonl=str(get('scrolls_jsonl', '')),
           truncate=str(get('scrolls_truncate', 'end')),
           max_output=int(get('scrolls_max_output_tokens', 128)),
           seq_len=int(data_config.seq_len), seed=int(get('seed', 0)),
           data_dir=str(get('data_dir', '')))
  if s['subset'] not in SUBSETS:
    raise ValueError(f"data.scrolls_subset={s['subset']!r} is not one of {SUBSETS}")
  if s['truncate'] not in TRUNCATIONS:
    raise ValueError(f"data.scrolls_truncate={s['truncate']!r} is not one of {TRUNCATIONS}")
  if not 1 <= s['max_output'] < s['seq_len'] // 2:
    raise ValueError(f"data.scrolls_max_output_tokens={s['max_output']} must be in "
                     f"[1, data.seq_len / 2)")
  return s


def read_examples(data_config, split: str) -> list[dict]:
  """The split's examples as dicts with id / input / output (str)."""
  s = settings(data_config)
  if s['jsonl']:
    path = storage.join(os.path.expanduser(s['jsonl']), f'{split}.jsonl')
    if not storage.isfile(path):
      raise ValueError(f"data.scrolls_jsonl={s['jsonl']!r} has no {split}.jsonl (one JSON "
                       f'object per line with the fields {FIELDS})')
    out = []
    for n, line in enumerate(storage.read_bytes(path).decode('utf-8').splitlines(), 1):
      if line.strip():
        row = json.loads(line)
        missing = [k for k in FIELDS if k not in row]
        if missing:
          raise ValueError(f'{path}:{n}: missing fields {missing} (need {FIELDS})')
        out.append({k: str(row[k]) for k in FIELDS})
    if not out:
      raise ValueError(f'{path} holds no examples')
    return out
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  name = f"scrolls/{s['subset']}"
  try:
    builder = tfds.builder(name, data_dir=s['data_dir'] or None)
    prepared = builder.is_prepared()
  except Exception:  # pylint: disable=broad-except  (unknown builder / unreadable data_dir)
    prepared = False
  if not prepared:
    raise ValueError(f"{name} is not prepared in data.data_dir={s['data_dir']!r}: run "
                     f"`tfds build {name} --data_dir={s['data_dir'] or '<dir>'}` on a machine "
                     f'with internet access, or give data.scrolls_jsonl')
  out = []
  for row in tfds.as_numpy(builder.as_dataset(split=split)):
    out.append({k: (row[k].decode('utf-8') if isinstance(row[k], bytes) else str(row[k]))
                for k in FIELDS})
  return out


def truncate(ids: list[int], budget: int, how: str) -> list[int]:
  """ids cut to at most `budget` tokens: 'end' keeps the beginning, 'front' the end,
  'middle' the first and last halves."""
  if len(ids) <= budget:
    return list(ids)
  if budget <= 0:
    return []
  if how == 'end':
    return list(ids[:budget])
  if how == 'front':
    return list(ids[len(ids) - budget:])
  head = (budget + 1) // 2
  return list(ids[:head]) + list(ids[len(ids) - (budget - head):])


def prompt_ids(tokenizer, text: str, budget: int, how: str) -> list[int]:
  """<bos> + the input truncated to fit + SEPARATOR: what the model continues."""
  sep = [int(i) for i in tokenizer.encode(SEPARATOR)]
  body = truncate([int(i) for i in tokenizer.encode(text)], budget - 1 - len(sep), how)
  return [int(tokenizer.bos_id)] + body + sep


def training_row(tokenizer, example: dict, s: dict) -> dict:
  """{'tokens': int32 [seq_len], 'loss_mask': bool [seq_len]} of one example."""
  answer = [int(i) for i in tokenizer.encode(example['output'])][:s['max_output']]
  answer.append(int(tokenizer.eos_id))
  prompt = prompt_ids(tokenizer, example['input'], s['seq_len'] - len(answer), s['truncate'])
  ids = prompt + answer
  tokens = np.full(s['seq_len'], int(tokenizer.eos_id), np.int32)  # right padding, unscored
  tokens[:len(ids)] = ids
  mask = np.zeros(s['seq_len'], bool)
  mask[len(prompt):len(ids)] = True
  return {'tokens': tokens, 'loss_mask': mask}


def get_tokenizer(data_config):
  path = data_config.get('tokenizer_path', '')
  if not path:
    raise ValueError("data.dataset='scrolls' needs data.tokenizer_path (a SentencePiece model, "
                     'e.g. <workdir>/tokenizer.model of the run being fine-tuned)')
  if not storage.isfile(os.path.expanduser(path)):
    raise ValueError(f'data.tokenizer_path={path!r} does not exist')
  return tokenizer_lib.Tokenizer(os.path.expanduser(path))


def make_train_iterator(data_config, batch_size_per_process: int, process_index: int = 0,
                        process_count: int = 1):
  """grain iterator of {'tokens', 'loss_mask'} [batch, seq_len]: the train split's examples,
  shuffled every epoch (data.seed), repeated (data.num_epochs; 0 = forever), partitioned across
  processes; get_state()/set_state()."""
  s = settings(data_config)
  tokenizer = get_tokenizer(data_config)
  examples = read_examples(data_config, 'train')
  epochs = int(data_config.get('num_epochs', 0)) or None
  ds = grain.MapDataset.source(examples).shuffle(seed=s['seed']).repeat(epochs)
  ds = ds[process_index::process_count].map(lambda e: training_row(tokenizer, e, s))
  return iter(ds.to_iter_dataset().batch(batch_size_per_process, drop_remainder=True))


def make_eval_blocks(data_config, length: int, split: str = 'validation',
                     max_tokens: int | None = None, stride: int | None = None):
  """(tokens [N, length], mask [N, length]): the split's examples as rows of `length`, scored
  on the output tokens only (the loss of a fine-tune, for train.eval_every)."""
  del stride
  s = dict(settings(data_config), seq_len=int(length))
  tokenizer = get_tokenizer(data_config)
  examples = read_examples(data_config, split)[:max(1, int(max_tokens or 65536) // length)]
  rows = [training_row(tokenizer, e, s) for e in examples]
  return (np.stack([r['tokens'] for r in rows]), np.stack([r['loss_mask'] for r in rows]))


generated.register(DATASET_NAME, generated.GeneratedDataset(
    get_tokenizer=get_tokenizer, make_train_iterator=make_train_iterator,
    make_eval_blocks=make_eval_blocks, file_tokenizer=True))
