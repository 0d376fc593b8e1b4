"""Slow, loop-based NumPy references for positions and positional encodings.

Written independently of the JAX code (one element at a time, the formula read literally), so
tests can compare the vectorised implementations against them. Other tests may import these.
"""

import math

import numpy as np


def bilevel_positions_ref(tokens_BxT, separator_ids, *, document_start_ids=None, pad_id=None,
                          restart_at_documents=False):
  """Token by token: returns dict of [B, T] int arrays token/intra/inter/document and valid."""
  tokens_BxT = np.asarray(tokens_BxT)
  seps = set(int(i) for i in separator_ids)
  bos = set(int(i) for i in (document_start_ids or ()))
  out = {k: np.zeros(tokens_BxT.shape, np.int64) for k in ('token', 'intra', 'inter',
                                                            'document')}
  valid = np.ones(tokens_BxT.shape, bool)
  for b in range(tokens_BxT.shape[0]):
    first = True
    token = intra = inter = doc = 0
    prev_sep = False
    for t in range(tokens_BxT.shape[1]):
      tok = int(tokens_BxT[b, t])
      if pad_id is not None and tok == pad_id:
        valid[b, t] = False
        continue
      if first:
        first = False
      else:
        starts_doc = tok in bos
        if starts_doc:
          doc += 1
        if restart_at_documents and starts_doc:
          token, intra, inter = 0, 0, 0
        else:
          token += 1
          if prev_sep:
            inter += 1
            intra = 0
          else:
            intra += 1
      prev_sep = tok in seps
      for key, val in (('token', token), ('intra', intra), ('inter', inter), ('document', doc)):
        out[key][b, t] = val
  out['valid'] = valid
  return out


def rope_ref(x_BxHxTxDh, positions_BxT, inv_freq, scale=1.0):
  """Rotate-half RoPE, one feature pair at a time, float64."""
  x = np.asarray(x_BxHxTxDh, np.float64)
  out = np.zeros_like(x)
  bsz, heads, t_len, dh = x.shape
  half = dh // 2
  for b in range(bsz):
    for h in range(heads):
      for t in range(t_len):
        for i in range(half):
          angle = float(positions_BxT[b, t]) * float(inv_freq[i])
          c, s = math.cos(angle), math.sin(angle)
          x1, x2 = x[b, h, t, i], x[b, h, t, i + half]
          out[b, h, t, i] = (x1 * c - x2 * s) * scale
          out[b, h, t, i + half] = (x2 * c + x1 * s) * scale
  return out


def _pairwise_ref(q_pos_BxQ, k_pos_BxK, num_heads, value_fn):
  q_pos_BxQ, k_pos_BxK = np.asarray(q_pos_BxQ), np.asarray(k_pos_BxK)
  bsz = max(q_pos_BxQ.shape[0], k_pos_BxK.shape[0])
  out = np.zeros((bsz, num_heads, q_pos_BxQ.shape[1], k_pos_BxK.shape[1]))
  for b in range(bsz):
    qb = q_pos_BxQ[min(b, q_pos_BxQ.shape[0] - 1)]
    kb = k_pos_BxK[min(b, k_pos_BxK.shape[0] - 1)]
    for h in range(num_heads):
      for i, qi in enumerate(qb):
        for j, kj in enumerate(kb):
          out[b, h, i, j] = value_fn(h, int(qi), int(kj))
  return out


def alibi_bias_ref(q_pos_BxQ, k_pos_BxK, slopes, slope_factor=1.0):
  return _pairwise_ref(q_pos_BxQ, k_pos_BxK, len(slopes),
                       lambda h, i, j: -slope_factor * slopes[h] * max(i - j, 0))


def kerple_log_bias_ref(q_pos_BxQ, k_pos_BxK, p, a):
  return _pairwise_ref(q_pos_BxQ, k_pos_BxK, len(p),
                       lambda h, i, j: -p[h] * math.log(1.0 + a[h] * max(i - j, 0)))


def fire_bias_ref(q_pos_BxQ, k_pos_BxK, *, c, l_multiplier, init_L, w_in, b_in, w_out, b_out,
                  eps=1e-6, negative_slope=0.0):
  """FIRE's bias by loops; negative_slope 0 = ReLU, 0.01 = LeakyReLU (FIRE under DAPE)."""
  w_in, b_in = np.asarray(w_in, np.float64), np.asarray(b_in, np.float64)
  w_out, b_out = np.asarray(w_out, np.float64), np.asarray(b_out, np.float64)
  psi = lambda x: math.log(abs(float(c) * x) + 1.0)
  threshold = abs(float(l_multiplier) * init_L)

  def value(h, i, j):
    d = psi(max(i - j, 0)) / (psi(max(i, threshold)) + eps)
    hidden = [_leaky(d * w_in[0, n] + b_in[n], negative_slope) for n in range(len(b_in))]
    return sum(hidden[n] * w_out[n, h] for n in range(len(b_in))) + b_out[h]
  return _pairwise_ref(q_pos_BxQ, k_pos_BxK, len(b_out), value)


def t5_bucket_ref(distance, num_buckets=32, max_distance=128, bidirectional=False):
  """Bucket of one integer distance q - k (Raffel et al.; float32 log as the original)."""
  offset = 0
  if bidirectional:
    num_buckets //= 2
    if distance < 0:
      offset = num_buckets
    n = abs(distance)
  else:
    n = max(distance, 0)
  max_exact = num_buckets // 2
  if n < max_exact:
    return offset + n
  ratio = np.float32(np.log(np.float32(n / max_exact))) / np.float32(
      math.log(max_distance / max_exact))
  large = max_exact + int(ratio * np.float32(num_buckets - max_exact))
  return offset + min(large, num_buckets - 1)


def _leaky(x, slope=0.01):
  return x if x >= 0 else slope * x


def dape_v1_ref(scores_BxHxQxK, bias_BxHxQxK, w_in, b_in, w_out, b_out):
  """A = S + B + MLP([S; B]) at every (b, q, k), one element at a time."""
  s = np.asarray(scores_BxHxQxK, np.float64)
  bsz, heads, q_len, k_len = s.shape
  bias = None if bias_BxHxQxK is None else np.broadcast_to(
      np.asarray(bias_BxHxQxK, np.float64), s.shape)
  out = np.zeros_like(s)
  hidden_n = len(b_in)
  for b in range(bsz):
    for i in range(q_len):
      for j in range(k_len):
        feats = list(s[b, :, i, j]) + ([] if bias is None else list(bias[b, :, i, j]))
        hid = [_leaky(sum(feats[c] * w_in[c, n] for c in range(len(feats))) + b_in[n])
               for n in range(hidden_n)]
        for h in range(heads):
          f = sum(hid[n] * w_out[n, h] for n in range(hidden_n)) + b_out[h]
          out[b, h, i, j] = s[b, h, i, j] + (0 if bias is None else bias[b, h, i, j]) + f
  return out


def dape_v2_ref(scores_BxHxQxK, bias_BxHxQxK, w_in, b_in, w_out, b_out):
  """Full-sequence DAPE V2 with positions arange: tril, conv(1,ks) 'same', leaky, conv."""
  s = np.asarray(scores_BxHxQxK, np.float64)
  bsz, heads, q_len, k_len = s.shape
  feats = s if bias_BxHxQxK is None else np.concatenate(
      [s, np.broadcast_to(np.asarray(bias_BxHxQxK, np.float64), s.shape)], axis=1)
  ks = w_in.shape[0]
  r = ks // 2
  x = feats.copy()
  for i in range(q_len):
    for j in range(k_len):
      if j > i:
        x[:, :, i, j] = 0.0

  def conv(inp, w, bias_vec):
    res = np.zeros((inp.shape[0], w.shape[2], q_len, k_len))
    for b in range(inp.shape[0]):
      for i in range(q_len):
        for j in range(k_len):
          acc = np.array(bias_vec, np.float64)
          for tap in range(ks):
            jj = j + tap - r
            if 0 <= jj < k_len:
              acc = acc + inp[b, :, i, jj] @ w[tap]
          res[b, :, i, j] = acc
    return res
  hid = conv(x, np.asarray(w_in, np.float64), b_in)
  hid = np.where(hid >= 0, hid, 0.01 * hid)
  f = conv(hid, np.asarray(w_out, np.float64), b_out)
  base = s if bias_BxHxQxK is None else s + np.broadcast_to(bias_BxHxQxK, s.shape)
  return base + f


def block_nll_loop(forward, params, tokens_NxL, mask_NxL):
  """(sum of NLL, scored count) of blocks, one block and one token at a time, float64 log-softmax.

  `forward(params, tokens [1, L]) -> logits [1, L, V]`; target t is scored from logits t-1 when
  mask[n, t] (column 0 never is).
  """
  total, count = 0.0, 0
  for n in range(tokens_NxL.shape[0]):
    logits = np.asarray(forward(params, tokens_NxL[n:n + 1]), np.float64)[0]
    for t in range(1, tokens_NxL.shape[1]):
      if mask_NxL[n, t]:
        row = logits[t - 1]
        log_z = np.log(np.sum(np.exp(row - row.max()))) + row.max()
        total += log_z - row[tokens_NxL[n, t]]
        count += 1
  return total, count


def _softmax_rows_ref(logits_row, visible_row):
  """Softmax over the visible entries of one row (a list), zeros elsewhere; all-hidden -> 0."""
  seen = [x for x, v in zip(logits_row, visible_row) if v]
  if not seen:
    return [0.0] * len(logits_row)
  top = max(seen)
  weights = [math.exp(x - top) if v else 0.0 for x, v in zip(logits_row, visible_row)]
  total = sum(weights)
  return [w / total for w in weights]


def segment_starts_ref(tokens_BxT, separator_ids, valid_BxT):
  """bool [B, T]: the valid token right after a separator (padding between them skipped)."""
  tokens_BxT, valid_BxT = np.asarray(tokens_BxT), np.asarray(valid_BxT, bool)
  out = np.zeros(tokens_BxT.shape, bool)
  for b in range(tokens_BxT.shape[0]):
    prev_is_sep = False
    for t in range(tokens_BxT.shape[1]):
      if not valid_BxT[b, t]:
        continue
      out[b, t] = prev_is_sep
      prev_is_sep = int(tokens_BxT[b, t]) in set(separator_ids)
  return out


def fox_attention_ref(q_BxHxTxDh, k_BxHxTxDh, v_BxHxTxDh, log_f_BxTxH, valid_BxT=None):
  """Forgetting attention, causal, float64, one logit at a time: q_i . k_j / sqrt(Dh) plus
  sum_{l = j+1 .. i} log f_l (the literal sum, no prefix sums); padding keys (valid False) are
  hidden, and their log f still counts (callers zero it). Returns [B, H, T, Dh]."""
  q, k, v = (np.asarray(x, np.float64) for x in (q_BxHxTxDh, k_BxHxTxDh, v_BxHxTxDh))
  log_f = np.asarray(log_f_BxTxH, np.float64)
  bsz, heads, t_len, dh = q.shape
  valid = np.ones((bsz, t_len), bool) if valid_BxT is None else np.asarray(valid_BxT, bool)
  out = np.zeros(q.shape)
  for b in range(bsz):
    for h in range(heads):
      for i in range(t_len):
        logits, visible = [], []
        for j in range(t_len):
          decay = sum(log_f[b, l, h] for l in range(j + 1, i + 1))
          logits.append(float(np.dot(q[b, h, i], k[b, h, j])) / math.sqrt(dh) + decay)
          visible.append(j <= i and valid[b, j])
        weights = _softmax_rows_ref(logits, visible)
        for j in range(t_len):
          out[b, h, i] += weights[j] * v[b, h, j]
  return out


def cope_attention_ref(q_BxHxTxDh, k_BxHxTxDh, v_BxHxTxDh, pos_emb_NxDh):
  """CoPE attention, causal, float64, one pair at a time: g_it = sigmoid(q_i . k_t / sqrt(Dh)),
  p_ij = min(sum_{t = j .. i} g_it, npos - 1), logit q_i . k_j / sqrt(Dh) + q_i . e(p_ij) /
  sqrt(Dh), e(p) linear between e[floor p] and e[ceil p]. Returns [B, H, T, Dh]."""
  q, k, v = (np.asarray(x, np.float64) for x in (q_BxHxTxDh, k_BxHxTxDh, v_BxHxTxDh))
  emb = np.asarray(pos_emb_NxDh, np.float64)
  npos = emb.shape[0]
  bsz, heads, t_len, dh = q.shape
  sig = lambda x: 1.0 / (1.0 + math.exp(-x))
  out = np.zeros(q.shape)
  for b in range(bsz):
    for h in range(heads):
      for i in range(t_len):
        scores = [float(np.dot(q[b, h, i], k[b, h, j])) / math.sqrt(dh) for j in range(t_len)]
        gates = [sig(x) for x in scores]
        logits = []
        for j in range(t_len):
          p = min(sum(gates[t] for t in range(j, i + 1)), npos - 1)
          lo, hi = math.floor(p), math.ceil(p)
          e = (1.0 - (p - lo)) * emb[lo] + (p - lo) * emb[hi]
          logits.append(scores[j] + float(np.dot(q[b, h, i], e)) / math.sqrt(dh))
        weights = _softmax_rows_ref(logits, [j <= i for j in range(t_len)])
        for j in range(t_len):
          out[b, h, i] += weights[j] * v[b, h, j]
  return out


def numerical_grads(fn, arrays, eps=1e-6):
  """Central differences (float64) of the scalar fn(*arrays) with respect to every array."""
  arrays = [np.array(a, np.float64) for a in arrays]
  grads = []
  for a in arrays:
    g = np.zeros_like(a)
    for index in np.ndindex(a.shape):
      old = a[index]
      a[index] = old + eps
      up = fn(*arrays)
      a[index] = old - eps
      down = fn(*arrays)
      a[index] = old
      g[index] = (up - down) / (2 * eps)
    grads.append(g)
  return grads
