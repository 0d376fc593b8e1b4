"""Writes tests/file_seconds.json (each test file's seconds, setup and teardown included) from a
pytest JUnit XML report, for conftest.py's longest-file-first order:

    python tests/record_file_seconds.py report.xml     # make test-times runs it
"""

import collections
import json
import os
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))


def file_seconds(report_path: str) -> dict[str, float]:
  """{'tests/x/test_y.py': seconds} summed over the report's test cases, rounded to 0.1 s."""
  totals = collections.Counter()
  for case in ET.parse(report_path).getroot().iter('testcase'):
    module = case.get('classname', '').split('.')
    parts = []
    for part in module:  # tests.attention.test_x[.Class] -> tests/attention/test_x.py
      parts.append(part)
      if part.startswith('test_'):
        break
    totals['/'.join(parts) + '.py'] += float(case.get('time', 0.0))
  return {name: round(seconds, 1) for name, seconds in sorted(totals.items())}


def main(argv):
  if len(argv) != 2:
    sys.exit('usage: python tests/record_file_seconds.py REPORT.xml')
  seconds = file_seconds(argv[1])
  with open(os.path.join(HERE, 'file_seconds.json'), 'w', encoding='utf-8') as f:
    json.dump(seconds, f, indent=1, sort_keys=True)
    f.write('\n')
  print(f'{len(seconds)} files, {sum(seconds.values()):.0f} s in all -> tests/file_seconds.json')


if __name__ == '__main__':
  main(sys.argv)
