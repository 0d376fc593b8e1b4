"""Kept for existing commands: configs/paper_151m.py:rope (the one parametrised 151M preset)."""

from configs import paper_151m


def get_config():
  return paper_151m.get_config('rope')
