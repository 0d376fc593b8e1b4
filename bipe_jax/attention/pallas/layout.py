"""Packs positions, documents and padding into the kernels' int32 side arrays, and pads to tiles.

Query side  q_info [B, Tq, INFO]: lane 0 the causal index, 1 the bias stream, 2 the document
            (the GPU kernels); the TPU kernels read it as rows, `query_rows` [B, INFO, Tq],
            and turn a tile's [INFO, q] into columns inside the kernel (`query_columns`, one
            [8, q] transpose): TPU memory pads the last axis to 128 lanes, so [.., Tq, 8] int32
            would move 512 bytes per query where the rows move 32.
Key side    k_info [B, INFO, Tk]: row 0 the causal index, 1 the bias stream, 2 the document,
            3 validity (1 real, 0 padding).
(Queries as columns and keys as rows, so a tile's [q, 1] and [1, k] slices broadcast to
[q, k].) Padded query rows get causal index INT32_MIN (they see
nothing under causal masking) and are cropped; padded keys are invalid.

Which tiles the kernels compute and fetch is derived from these arrays by tile_ranges.py.
"""

import jax
import jax.numpy as jnp

INFO = 8  # sublanes / lanes of the int side arrays (rows 0-3 used)
POS, STREAM, DOC, VALID = 0, 1, 2, 3
_I32 = jnp.iinfo(jnp.int32)


def pad_to(x: jax.Array, axis: int, size: int, value) -> jax.Array:
  if x.shape[axis] == size:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, widths, constant_values=value)


def round_up(n: int, block: int) -> int:
  return -(-n // block) * block


def query_info(q_pos_BxQ, q_stream_BxQ, q_document_BxQ, padded: int) -> jax.Array:
  """int32 [B, padded, INFO]."""
  b, nq = q_pos_BxQ.shape
  doc = jnp.zeros((b, nq), jnp.int32) if q_document_BxQ is None else q_document_BxQ
  cols = [pad_to(q_pos_BxQ.astype(jnp.int32), 1, padded, _I32.min),
          pad_to(q_stream_BxQ.astype(jnp.int32), 1, padded, 0),
          pad_to(doc.astype(jnp.int32), 1, padded, -1)]
  info = jnp.stack(cols, axis=-1)
  return pad_to(info, 2, INFO, 0)


def query_rows(q_pos_BxQ, q_stream_BxQ, q_document_BxQ, padded: int) -> jax.Array:
  """int32 [B, INFO, padded]: `query_info` with the tokens in lanes (the TPU kernels)."""
  return jnp.swapaxes(query_info(q_pos_BxQ, q_stream_BxQ, q_document_BxQ, padded), 1, 2)


def query_columns(q_rows_IxQ: jax.Array) -> jax.Array:
  """[INFO, q] -> [q, INFO] inside a kernel: a tile of `query_rows` as `query_info`'s."""
  return q_rows_IxQ.T


def key_info(k_pos_BxK, k_stream_BxK, k_document_BxK, k_valid_BxK, padded: int) -> jax.Array:
  """int32 [B, INFO, padded]."""
  b, nk = k_pos_BxK.shape
  doc = jnp.zeros((b, nk), jnp.int32) if k_document_BxK is None else k_document_BxK
  valid = jnp.ones((b, nk), jnp.int32) if k_valid_BxK is None else k_valid_BxK
  rows = [pad_to(k_pos_BxK.astype(jnp.int32), 1, padded, _I32.max),
          pad_to(k_stream_BxK.astype(jnp.int32), 1, padded, 0),
          pad_to(doc.astype(jnp.int32), 1, padded, -2),
          pad_to(valid.astype(jnp.int32), 1, padded, 0)]
  info = jnp.stack(rows, axis=1)
  return pad_to(info, 1, INFO, 0)


def visible(q_info_QxI, k_info_IxK, causal: bool) -> jax.Array:
  """bool [q, k] inside a kernel: valid key, same document, and (causal) k_pos <= q_pos."""
  vis = (k_info_IxK[VALID:VALID + 1, :] != 0) & (
      q_info_QxI[:, DOC:DOC + 1] == k_info_IxK[DOC:DOC + 1, :])
  if causal:
    vis = vis & (k_info_IxK[POS:POS + 1, :] <= q_info_QxI[:, POS:POS + 1])
  return vis


def streams(q_info_QxI, k_info_IxK):
  """(q stream [q, 1], k stream [1, k]) int32 inside a kernel."""
  return q_info_QxI[:, STREAM:STREAM + 1], k_info_IxK[STREAM:STREAM + 1, :]


def row_to_column(x_1xN: jax.Array) -> jax.Array:
  """[1, N] -> [N, 1] inside a kernel (via an [8, N] transpose, a shape Mosaic transposes)."""
  return jnp.broadcast_to(x_1xN, (INFO, x_1xN.shape[1])).T[:, :1]


def column_to_row(x_Nx1: jax.Array) -> jax.Array:
  """[N, 1] -> [1, N] inside a kernel (via an [N, 128] transpose)."""
  return jnp.broadcast_to(x_Nx1, (x_Nx1.shape[0], 128)).T[:1, :]
