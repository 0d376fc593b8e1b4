"""Exact-match accuracy on the arithmetic chain-of-thought task, by problem length.

Greedy decoding with a simple loop of full forwards over a fixed [B, max_len] buffer (one
compiled shape; the model is causal, so whatever sits right of a row's cursor does not change
the logits at the cursor). Each row stops at `<eos>` or at `max_len`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bipe_jax.tasks import arithmetic
from bipe_jax.tasks import modular_expressions as expressions

ApplyFn = Callable[..., jax.Array]  # apply_fn(params, tokens_BxL) -> logits [B, L, V]


def make_greedy_step(apply_fn: ApplyFn):
  """jitted (params, buf_BxL, cur_B, done_B, eos) -> (buf, cur, done): appends one greedy token
  at each unfinished row's cursor `cur` (the number of tokens already in the row)."""

  def step(params, buf, cur, done, eos_id):
    logits = apply_fn(params, buf)
    rows = jnp.arange(buf.shape[0])
    nxt = jnp.argmax(logits[rows, cur - 1], axis=-1).astype(buf.dtype)
    write = ~done & (cur < buf.shape[1])
    col = jnp.minimum(cur, buf.shape[1] - 1)
    buf = buf.at[rows, col].set(jnp.where(write, nxt, buf[rows, col]))
    cur = cur + write.astype(cur.dtype)
    done = done | (write & (nxt == eos_id)) | (cur >= buf.shape[1])
    return buf, cur, done

  return jax.jit(step)


def greedy_generate(apply_fn: ApplyFn, params, prompts: Sequence[Sequence[int]], *, max_len: int,
                    eos_id: int, batch_size: int = 64, step_fn=None) -> list[list[int]]:
  """Greedy continuations (without the prompt, up to and including `<eos>` when produced)."""
  if any(len(p) == 0 for p in prompts):
    raise ValueError('greedy_generate: every prompt needs at least one token (e.g. <bos>)')
  if any(len(p) >= max_len for p in prompts):
    raise ValueError(f'greedy_generate: a prompt is as long as max_len={max_len}')
  step_fn = step_fn or make_greedy_step(apply_fn)
  out: list[list[int]] = []
  for start in range(0, len(prompts), batch_size):
    chunk = list(prompts[start:start + batch_size])
    n = len(chunk)
    chunk += [chunk[0]] * (batch_size - n)  # pad to one compiled shape
    buf = np.zeros((batch_size, max_len), np.int32)
    cur = np.array([len(p) for p in chunk], np.int32)
    for i, p in enumerate(chunk):
      buf[i, :len(p)] = p
    done = np.zeros(batch_size, bool)
    done[n:] = True
    buf, cur_j, done_j = jnp.asarray(buf), jnp.asarray(cur), jnp.asarray(done)
    for _ in range(max_len - int(cur.min())):
      buf, cur_j, done_j = step_fn(params, buf, cur_j, done_j, eos_id)
      if bool(jnp.all(done_j)):
        break
    buf, end = np.asarray(buf), np.asarray(cur_j)
    out += [buf[i, cur[i]:end[i]].tolist() for i in range(n)]
  return out


@dataclasses.dataclass(frozen=True)
class LengthAccuracy:
  num_ops: int
  count: int
  answer_correct: int  # final answer right
  chain_correct: int  # every generated step a valid one-operator reduction, answer right
  mean_tokens: float  # mean length of the full problem sequence (<bos> ... <eos>)

  @property
  def accuracy(self) -> float:
    return self.answer_correct / self.count

  @property
  def chain_accuracy(self) -> float:
    return self.chain_correct / self.count

  def to_dict(self) -> dict:
    return dict(num_ops=self.num_ops, count=self.count, accuracy=self.accuracy,
                chain_accuracy=self.chain_accuracy, answer_correct=self.answer_correct,
                chain_correct=self.chain_correct, mean_tokens=self.mean_tokens)


def score_solution(generated_ids: Sequence[int],
                   problem: arithmetic.Problem) -> tuple[bool, bool]:
  """(answer right, chain valid) of a generated continuation of `<bos> expression =`.

  The answer is right when the generation ends with `<eos>` and its last step (the pieces
  after the last '=') is the reference answer. The chain is valid when, in addition, every
  step is a one-operator reduction of the step before it
  (modular_expressions.is_one_reduction): the reduction order of the data is random, so a
  chain other than the reference can be right.
  """
  tok = arithmetic.ArithmeticTokenizer()
  ids = list(generated_ids)
  if not ids or ids[-1] != tok.eos_id:
    return False, False
  steps, current = [], []
  for i in ids[:-1]:
    if i == tok.separator_id:
      steps.append(current)
      current = []
    elif i < len(arithmetic.SPECIALS):
      return False, False  # a <bos>/<unk> inside a solution
    else:
      current.append(tok.id_to_piece(i))
  steps.append(current)
  answer_ok = steps[-1] == arithmetic.split_pieces(problem.answer)
  chain = [arithmetic.split_pieces(problem.expression)] + steps
  chain_ok = answer_ok and all(expressions.is_one_reduction(a, b, problem.modulus)
                               for a, b in zip(chain, chain[1:]))
  return answer_ok, chain_ok


def teacher_forced_chain_correct(apply_fn: ApplyFn, params, sequences: Sequence[Sequence[int]],
                                 prompt_lengths: Sequence[int], *, max_len: int,
                                 batch_size: int = 64, forward=None) -> np.ndarray:
  """bool [N]: whether greedy decoding from each prompt would reproduce the rest of its
  sequence exactly (every argmax along the reference continuation is the reference token).

  Equivalent to greedy decoding + exact match of the whole reference solution, with one
  forward pass.
  """
  forward = forward or jax.jit(apply_fn)
  out = np.zeros(len(sequences), bool)
  for start in range(0, len(sequences), batch_size):
    chunk = list(sequences[start:start + batch_size])
    buf = np.zeros((batch_size, max_len), np.int32)
    for i, seq in enumerate(chunk):
      buf[i, :len(seq)] = seq
    pred = np.asarray(jnp.argmax(forward(params, jnp.asarray(buf)), axis=-1))
    for i, seq in enumerate(chunk):
      p = prompt_lengths[start + i]
      out[start + i] = bool(np.all(pred[i, p - 1:len(seq) - 1] == buf[i, p:len(seq)]))
  return out


def accuracy_by_length(apply_fn: ApplyFn, params, problems: dict[int, list[arithmetic.Problem]],
                       *, batch_size: int = 64, max_len: int | None = None,
                       progress: Callable[[int], None] | None = None) -> list[LengthAccuracy]:
  """Greedy-decodes every problem from its prompt `<bos> expr =` and scores it
  (`score_solution`).

  A teacher-forced pass first finds the problems whose greedy solution would be the reference
  (then answer and chain are right); only the others are decoded token by token. Same result
  as decoding all, less work. max_len (default: the longest chain the operator counts allow,
  plus <bos>/<eos>) bounds the decoding.
  """
  tok = arithmetic.ArithmeticTokenizer()
  longest = max(expressions.max_chain_tokens(n) for n in problems) + 2
  max_len = max_len or longest
  step_fn = make_greedy_step(apply_fn)
  forward = jax.jit(apply_fn)
  results = []
  for n, ps in sorted(problems.items()):
    prompts = [tok.encode(p.prompt, add_bos=True) for p in ps]
    full = [tok.encode(p.text, add_bos=True, add_eos=True) for p in ps]
    chain = teacher_forced_chain_correct(apply_fn, params, full, [len(x) for x in prompts],
                                         max_len=max_len, batch_size=batch_size,
                                         forward=forward)
    todo = [i for i in range(len(ps)) if not chain[i]]
    outs = greedy_generate(apply_fn, params, [prompts[i] for i in todo], max_len=max_len,
                           eos_id=tok.eos_id, batch_size=batch_size,
                           step_fn=step_fn) if todo else []
    answer_ok = chain_ok = int(chain.sum())
    for i, ids in zip(todo, outs):
      a, c = score_solution(ids, ps[i])
      answer_ok += int(a)
      chain_ok += int(c)
    results.append(LengthAccuracy(n, len(ps), answer_ok, chain_ok,
                                  float(np.mean([len(x) for x in full]))))
    if progress:
      progress(n)
  return results


def format_accuracy_table(results: dict[str, Sequence[LengthAccuracy]],
                          train_max_ops: int | None = None) -> str:
  """Markdown table: operators / mean tokens / answer accuracy (valid-chain accuracy) per run."""
  labels = list(results)
  by = {lab: {r.num_ops: r for r in rows} for lab, rows in results.items()}
  ops = sorted({r.num_ops for rows in results.values() for r in rows})
  lines = ['| operators | mean tokens | ' + ' | '.join(labels) + ' |',
           '|---:|---:|' + '---:|' * len(labels)]
  for n in ops:
    any_r = next(by[l][n] for l in labels if n in by[l])
    mark = ' (train)' if train_max_ops is not None and n <= train_max_ops else ''
    cells = [f'{by[l][n].accuracy:.3f} ({by[l][n].chain_accuracy:.3f})' if n in by[l] else '-'
             for l in labels]
    lines.append(f'| {n}{mark} | {any_r.mean_tokens:.1f} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)
