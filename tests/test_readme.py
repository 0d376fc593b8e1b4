"""The README's import example runs as written, so it cannot rot."""

import os
import re

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'README.md')


def _example_code() -> str:
  text = open(README).read()
  section = text.split('## Using an encoding in your own Flax model', 1)[1]
  match = re.search(r'```python\n(.*?)```', section, re.S)
  assert match, 'README has no python example in the import section'
  return match.group(1)


def test_readme_import_example_runs():
  namespace = {}
  exec(compile(_example_code(), 'README.md', 'exec'), namespace)  # pylint: disable=exec-used
  out = namespace['out']
  assert out.shape == (1, 8, 32)
  # The example is causal: the first output row depends only on the first token.
  tokens2 = namespace['tokens'].at[0, 5:].set(9)
  out2 = namespace['layer'].apply(namespace['params'], namespace['x'], tokens2)
  assert abs(float((out2[0, :5] - out[0, :5]).max())) < 1e-6
