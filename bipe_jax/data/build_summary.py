"""The few lines `train/build_data.py` prints about a build (the full record: --json).

    summary = {'dataset', 'version_dir', 'tokenizer', 'built', 'trained_tokenizer',
               'prepare_seconds', 'report' (optional), '<split>_tokens' (each split counted),
               'vocab_size', 'separators_auto' (optional), 'wall_seconds'}
"""

from __future__ import annotations

# Build-report counters that mean some input was not used as given: (key, what it counts).
_PROBLEMS = (('empty_skipped', 'empty documents skipped'),
             ('undecodable_documents', 'documents with undecodable bytes (replaced)'),
             ('ignored_files', 'files ignored'), ('bad_json_lines', 'bad .jsonl lines'))


def _pair(counts: dict, what: str) -> str:
  return f'{counts.get("train", 0):,} train / {counts.get("validation", 0):,} validation {what}'


def format_summary(summary: dict) -> str:
  """3-5 lines: the dataset, the tokenizer, the token counts, input problems, the wall time."""
  report = summary.get('report') or {}
  done = 'built' if summary['built'] else 'already built'
  line = f'{summary["dataset"]}: {done} in {summary["version_dir"]}'
  if 'documents' in report:
    line += f' ({_pair(report["documents"], "documents")})'
  lines = [line]
  tok = 'trained' if summary['trained_tokenizer'] else 'existing'
  line = f'tokenizer: {summary["tokenizer"]} ({tok}'
  if 'vocab_size' in summary:
    line += f', vocabulary {summary["vocab_size"]:,}'
  if 'separators_auto' in summary:
    line += f', {summary["separators_auto"]} separator pieces under model.separators=auto'
  lines.append(line + ')')
  counts = [(split, summary[f'{split}_tokens']) for split in ('train', 'validation', 'test')
            if f'{split}_tokens' in summary]
  if counts:
    lines.append('tokens: ' + ' / '.join(f'{n:,} {split}' for split, n in counts))
  problems = [f'{report[k]:,} {what}' for k, what in _PROBLEMS if report.get(k)]
  if problems:
    lines.append('input: ' + '; '.join(problems) + ' (details: --json)')
  lines.append(f'done in {summary["wall_seconds"]:.1f} s')
  return '\n'.join(lines)
