"""Writes tests/test_seconds.json from a pytest JUnit XML report of the whole suite:

    python tests/record_test_seconds.py report.xml     # make test-times runs it

- "files": each test file's seconds (setup and teardown included): conftest.py hands the files
  to the workers longest first.
- "slow": every test that took at least SLOW_SECONDS: conftest.py marks them `slow`, so
  `make test-fast` (the edit loop) leaves them out with the tests marked slow in their files;
  `make test` runs everything.
"""

import collections
import json
import os
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
SLOW_SECONDS = 1.0


def node_id(classname: str, name: str) -> str:
  """'tests.attention.test_x[.Class]' + 'test_y[p]' -> 'tests/attention/test_x.py[::Class]::test_y[p]'."""
  parts = classname.split('.')
  module = next(i for i, part in enumerate(parts) if part.startswith('test_'))
  return '::'.join(['/'.join(parts[:module + 1]) + '.py', *parts[module + 1:], name])


def test_seconds(report_path: str) -> dict:
  """{'files': {file: seconds}, 'slow': {node id: seconds}}, rounded to 0.1 s."""
  files, slow = collections.Counter(), {}
  for case in ET.parse(report_path).getroot().iter('testcase'):
    nid = node_id(case.get('classname', ''), case.get('name', ''))
    seconds = float(case.get('time', 0.0))
    files[nid.split('::')[0]] += seconds
    if seconds >= SLOW_SECONDS:
      slow[nid] = round(seconds, 1)
  return {'files': {f: round(s, 1) for f, s in sorted(files.items())},
          'slow': dict(sorted(slow.items()))}


def main(argv):
  if len(argv) != 2:
    sys.exit('usage: python tests/record_test_seconds.py REPORT.xml')
  seconds = test_seconds(argv[1])
  with open(os.path.join(HERE, 'test_seconds.json'), 'w', encoding='utf-8') as f:
    json.dump(seconds, f, indent=1, sort_keys=True)
    f.write('\n')
  print(f'{len(seconds["files"])} files, {sum(seconds["files"].values()):.0f} s in all; '
        f'{len(seconds["slow"])} tests of {SLOW_SECONDS:g} s or more -> tests/test_seconds.json')


if __name__ == '__main__':
  main(sys.argv)
