"""SCROLLS scoring: greedy answers for a split's examples and the official metrics.

Metrics (as the SCROLLS benchmark defines them per subset; an id with several reference
outputs scores the best of them):
  exact match   quality, contract_nli      (normalised: lower case, no punctuation, no
                                            articles, single spaces: the SQuAD normalisation)
  token F1      qasper, narrative_qa       (the same normalisation, bag of tokens)
  ROUGE         gov_report, summ_screen_fd, qmsum: geometric mean of ROUGE-1, ROUGE-2 and
                ROUGE-L F-measures (the `rouge-score` package, Porter stemming)
Answers: the prompt is `<bos> input SEPARATOR` (bipe_jax.tasks.scrolls.prompt_ids, the input
truncated to leave room for the answer), a batch of prompts of different lengths is left-padded
and decoded greedily together (bipe_jax.generation), and the answer is the text before <eos>.
"""

from __future__ import annotations

import collections
import math
import re
import string
from typing import Sequence

import numpy as np

from bipe_jax.tasks import scrolls as scrolls_task

METRIC_OF_SUBSET = {'quality': 'exact_match', 'contract_nli': 'exact_match',
                    'qasper': 'f1', 'narrative_qa': 'f1',
                    'gov_report': 'rouge', 'summ_screen_fd': 'rouge', 'qmsum': 'rouge'}


def normalize(text: str) -> str:
  text = text.lower()
  text = ''.join(c for c in text if c not in set(string.punctuation))
  text = re.sub(r'\b(a|an|the)\b', ' ', text)
  return ' '.join(text.split())


def exact_match(prediction: str, reference: str) -> float:
  return float(normalize(prediction) == normalize(reference))


def token_f1(prediction: str, reference: str) -> float:
  pred, ref = normalize(prediction).split(), normalize(reference).split()
  common = collections.Counter(pred) & collections.Counter(ref)
  same = sum(common.values())
  if not pred or not ref:
    return float(pred == ref)
  if same == 0:
    return 0.0
  precision, recall = same / len(pred), same / len(ref)
  return 2 * precision * recall / (precision + recall)


_ROUGE = {}


def rouge_geometric_mean(prediction: str, reference: str) -> float:
  """Geometric mean of the ROUGE-1, ROUGE-2 and ROUGE-L F-measures."""
  if 'scorer' not in _ROUGE:
    from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top
    _ROUGE['scorer'] = rouge_scorer.RougeScorer(['rouge1', 'rouge2', 'rougeL'],
                                                use_stemmer=True)
  scores = _ROUGE['scorer'].score(reference, prediction)
  values = [scores[k].fmeasure for k in ('rouge1', 'rouge2', 'rougeL')]
  return float(math.prod(values) ** (1 / 3))


METRICS = {'exact_match': exact_match, 'f1': token_f1, 'rouge': rouge_geometric_mean}


def score(subset: str, predictions: dict[str, str], references: dict[str, list[str]]) -> dict:
  """{'metric', 'score' (mean over ids, x100), 'count'}: each id's best over its references."""
  name = METRIC_OF_SUBSET[subset]
  fn = METRICS[name]
  per_id = [max(fn(predictions[i], r) for r in references[i]) for i in references]
  return {'metric': name, 'score': 100.0 * float(np.mean(per_id)), 'count': len(per_id)}


def generate_answers(run, examples: Sequence[dict], *, max_new_tokens: int = 64,
                     batch_size: int = 8, prompt_tokens: int | None = None) -> dict[str, str]:
  """{id: greedy answer text} for the examples (one answer per id)."""
  from bipe_jax import data  # pylint: disable=g-import-not-at-top
  from bipe_jax import generation  # pylint: disable=g-import-not-at-top
  tokenizer = data.get_tokenizer(run.config.data)
  s = scrolls_task.settings(run.config.data)
  budget = int(prompt_tokens or s['seq_len']) - max_new_tokens
  unique = list({e['id']: e for e in examples}.values())
  eos = int(tokenizer.eos_id)
  answers = {}
  for start in range(0, len(unique), batch_size):
    chunk = unique[start:start + batch_size]
    prompts = [scrolls_task.prompt_ids(tokenizer, e['input'], budget, s['truncate'])
               for e in chunk]
    tokens, valid = generation.left_pad(prompts, pad_value=eos)
    with run.context():
      out = generation.generate(run.model, run.params, tokens, prompt_valid_BxP=valid,
                                max_new_tokens=max_new_tokens, eos_id=eos)
    for e, row in zip(chunk, np.asarray(out)[:, tokens.shape[1]:].tolist()):
      row = row[:row.index(eos)] if eos in row else row
      answers[e['id']] = tokenizer.decode(row)
  return answers


def references_by_id(examples: Sequence[dict]) -> dict[str, list[str]]:
  refs = collections.defaultdict(list)
  for e in examples:
    refs[e['id']].append(e['output'])
  return dict(refs)
