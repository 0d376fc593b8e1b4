"""Print sample continuations from a workdir's checkpoint, decoded with the KV cache.

  python eval/generate.py --workdir=runs/bipe_rope --prompt="Once upon a time" \
      --max_new_tokens=64 --temperature=0.8 --top_k=40 --top_p=0.95 --num_samples=2
  python eval/generate.py --workdir=converted --prompt_ids=1,450,4996    # no tokenizer needed

Works for training workdirs and for folders written by `python -m bipe_jax.convert`.
--temperature=0 is greedy. All logic lives in bipe_jax.generation.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from bipe_jax import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

_WORKDIR = flags.DEFINE_string('workdir', None, 'Training workdir or converted checkpoint.')
_PROMPT = flags.DEFINE_string('prompt', '', 'Prompt text (encoded with the run\'s tokenizer).')
_PROMPT_IDS = flags.DEFINE_list('prompt_ids', None, 'Prompt as comma-separated token ids.')
_MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Tokens to generate.')
_TEMPERATURE = flags.DEFINE_float('temperature', 0.8, '0 = greedy.')
_TOP_K = flags.DEFINE_integer('top_k', 40, 'Keep the k most likely tokens (0 = all).')
_TOP_P = flags.DEFINE_float('top_p', 0.95, 'Nucleus mass (1 = all).')
_NUM_SAMPLES = flags.DEFINE_integer('num_samples', 1, 'Continuations of the same prompt.')
_SEED = flags.DEFINE_integer('seed', 0, 'Sampling seed.')
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
flags.mark_flag_as_required('workdir')


def main(argv):
  from bipe_jax.kernels import process_setup  # pylint: disable=g-import-not-at-top
  process_setup.setup_process()  # a CPU run's set-up (freed memory kept), before JAX starts
  from bipe_jax import generation  # pylint: disable=g-import-not-at-top
  try:
    sampling = generation.SamplingConfig(temperature=_TEMPERATURE.value, top_k=_TOP_K.value,
                                         top_p=_TOP_P.value)
    ids = None if _PROMPT_IDS.value is None else [int(i) for i in _PROMPT_IDS.value]
    result = generation.generate_from_workdir(
        _WORKDIR.value, prompt=_PROMPT.value, prompt_ids=ids, max_new_tokens=_MAX_NEW.value,
        sampling=sampling, num_samples=_NUM_SAMPLES.value, seed=_SEED.value, step=_STEP.value)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(f'{result["encoding"]} checkpoint step {result["step"]}; prompt ids '
        f'{result["prompt_ids"]}')
  for i, (ids, text) in enumerate(zip(result['samples'], result['texts'])):
    print(f'--- sample {i}')
    print(f'ids: {",".join(str(t) for t in ids)}')
    if text is not None:
      print(f'text: {_PROMPT.value}{text}')
  return 0


if __name__ == '__main__':
  cli.run(main)
