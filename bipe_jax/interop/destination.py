"""The output directory of a conversion, checked before anything is read or written.

A conversion writes into a NEW or EMPTY directory only: an existing training workdir or model
folder is never modified (its config.json, checkpoints and tokenizer stay as they were). With
`overwrite=True` the directory's previous contents are removed first, and only after the
source has been read and mapped successfully (`clear_destination`). The source itself is never
an acceptable destination.
"""

from __future__ import annotations

import os

from bipe_jax import storage


def check_destination(dst: str, src: str, *, overwrite: bool = False) -> None:
  """Raises ValueError (one line naming `dst`) unless `dst` may receive a conversion of `src`.

  Accepted: a path that does not exist, an empty directory, or (with `overwrite`) any
  directory that is neither the source nor one of its parents.
  """
  if storage.exists(dst) and not storage.isdir(dst):
    raise ValueError(f'--to {dst!r} is a file, not a directory')
  real_dst, real_src = (p if not storage.is_local(p) else os.path.realpath(p)
                        for p in (dst, src))
  if real_dst == real_src or real_src.startswith(real_dst.rstrip(os.sep) + os.sep):
    raise ValueError(f'--to {dst!r} is the source {src!r} (or holds it): convert into a new '
                     'directory')
  if storage.isdir(dst) and storage.listdir(dst) and not overwrite:
    names = sorted(storage.listdir(dst))
    held = ', '.join(names[:4]) + (' ...' if len(names) > 4 else '')
    raise ValueError(f'--to {dst!r} already exists and is not empty (it holds {held}): give a '
                     'new or empty directory, or --overwrite to replace its contents')


def clear_destination(dst: str) -> None:
  """Removes everything inside `dst` (kept as an empty directory); creates it if missing. A
  local folder or gs://... alike (bipe_jax.storage)."""
  if storage.isdir(dst):
    for name in storage.listdir(dst):
      storage.remove(storage.join(dst, name))
  storage.makedirs(dst)
