"""gcsfs with bounded retries: the filesystem bipe_jax.storage binds to gs:// and gcs://.

gcsfs's plain JSON-API filesystem (`gcsfs.core.GCSFileSystem`), with its three retried request
methods (`_request`, which every listing, read, write and delete goes through, and the two
file downloads) tried as bipe_jax.storage_faults.RetryPolicy says instead of gcsfs's fixed six
tries; a request that runs out of tries raises StorageUnreachableError (one line naming the
bucket and the endpoint) in place of gcsfs's traceback. Connections time out after the policy's
`connect_timeout_s`, and a response that sends nothing for READ_TIMEOUT_S fails that try.

`exists`, `isdir` and `isfile` let StorageUnreachableError through: fsspec's own read every
error as "no such file", so a run would take a bucket that does not answer for an empty one
(evaluation said "workdir does not exist (train first)").
"""

from __future__ import annotations

import asyncio
import re

import aiohttp
import gcsfs.core
import gcsfs.retry
from fsspec import asyn

from bipe_jax import storage_faults

READ_TIMEOUT_S = 120.0  # a response that sends nothing for this long fails the try


def _bucket_of(path, args) -> str:
  """The bucket a gcsfs request names: its first template argument ('b/{}/o/{}'), the bucket
  of an upload URL (.../b/BUCKET/o...), or the first part of a 'bucket/key' path."""
  if args and '{}' in str(path):
    return str(args[0])
  match = re.search(r'/b/([^/?]+)', str(path))
  if match:
    return match.group(1)
  return str(path).split('://', 1)[-1].split('/', 1)[0]


def _bounded(request, *, path_index: int):
  """`request` (a gcsfs coroutine method without its retry decorator) tried as the policy of
  the environment says; `path_index`: the position of its path among the positional
  arguments after self."""

  async def call(self, *args, **kwargs):
    policy = storage_faults.RetryPolicy.from_env()
    for attempt in range(policy.attempts):
      try:
        return await request(self, *args, **kwargs)
      except Exception as e:  # pylint: disable=broad-except
        retriable = (isinstance(e, (asyncio.TimeoutError, ConnectionError))
                     or gcsfs.retry.is_retriable(e))
        if not retriable:
          raise
        if attempt == policy.attempts - 1:
          path = args[path_index] if len(args) > path_index else ''
          raise storage_faults.unreachable(
              _bucket_of(path, args[path_index + 1:]), e, policy) from None
      await asyncio.sleep(policy.wait(attempt))
    raise AssertionError('unreachable')  # the loop returns or raises

  call.__name__ = request.__name__
  call.__doc__ = request.__doc__
  return call


_PLAIN = gcsfs.core.GCSFileSystem


class BoundedGCSFileSystem(_PLAIN):
  """gcsfs.core.GCSFileSystem with bounded retries (module docstring)."""

  _request = _bounded(_PLAIN._request.__wrapped__, path_index=1)  # (method, path, *args)
  _get_file_request = _bounded(_PLAIN._get_file_request.__wrapped__, path_index=0)
  _get_file_concurrent = _bounded(_PLAIN._get_file_concurrent.__wrapped__, path_index=0)

  def __init__(self, *args, **kwargs):
    if kwargs.get('requests_timeout') is None:
      policy = storage_faults.RetryPolicy.from_env()
      kwargs['requests_timeout'] = aiohttp.ClientTimeout(
          sock_connect=policy.connect_timeout_s, sock_read=READ_TIMEOUT_S)
    super().__init__(*args, **kwargs)

  async def _exists(self, path, **kwargs):
    try:
      await self._info(path, **kwargs)
      return True
    except storage_faults.StorageUnreachableError:
      raise
    except Exception:  # pylint: disable=broad-except  (fsspec's reading: not there)
      return False

  async def _isfile(self, path):
    try:
      return (await self._info(path))['type'] == 'file'
    except storage_faults.StorageUnreachableError:
      raise
    except Exception:  # pylint: disable=broad-except
      return False

  def exists(self, path, **kwargs):
    return asyn.sync(self.loop, self._exists, path, **kwargs)

  def isfile(self, path):
    return asyn.sync(self.loop, self._isfile, path)
