"""Loop-based NumPy reference of the segment streams beyond the bilevel ones: fixed-length
segments (separator rule 'fixed:K') and hierarchical BiPE's paragraph / sentence streams.

Written token by token from the definitions (docs/design.md, "Segmentation ablation and
hierarchy"), independently of bipe_jax/positions.py.
"""

import numpy as np

STREAMS = ('token', 'intra', 'inter', 'document', 'paragraph', 'sentence')


def segment_streams_ref(tokens_BxT, separator_ids, *, paragraph_ids=(), fixed=0,
                        document_start_ids=(), pad_id=None, restart_at_documents=False):
  """dict of [B, T] int arrays (STREAMS; 0 at padding) and the bool 'valid' mask.

  A valid token after a separator or a paragraph separator starts a new segment (a paragraph
  separator also starts a new paragraph); with `fixed` = K > 0 the K-th, 2K-th... token of the
  token stream start segments instead. A document start (with restart_at_documents) resets
  every stream but the document index.
  """
  tokens_BxT = np.asarray(tokens_BxT)
  seps, pars, bos = set(separator_ids), set(paragraph_ids), set(document_start_ids)
  out = {k: np.zeros(tokens_BxT.shape, np.int64) for k in STREAMS}
  valid = np.ones(tokens_BxT.shape, bool)
  for b in range(tokens_BxT.shape[0]):
    seen_first = False
    s = dict.fromkeys(STREAMS, 0)
    prev_sep = prev_par = False
    for t in range(tokens_BxT.shape[1]):
      tok = int(tokens_BxT[b, t])
      if pad_id is not None and tok == pad_id:
        valid[b, t] = False
        continue
      if seen_first:
        starts_doc = tok in bos
        s['document'] += starts_doc
        if restart_at_documents and starts_doc:
          s.update(token=0, intra=0, inter=0, paragraph=0, sentence=0)
        else:
          s['token'] += 1
          if fixed:
            new_segment = s['token'] % fixed == 0
          else:
            new_segment = prev_sep or prev_par
          if new_segment:
            s['inter'] += 1
            s['intra'] = 0
            if prev_par:
              s['paragraph'] += 1
              s['sentence'] = 0
            else:
              s['sentence'] += 1
          else:
            s['intra'] += 1
      seen_first = True
      prev_sep, prev_par = tok in seps, tok in pars
      for k in STREAMS:
        out[k][b, t] = s[k]
  out['valid'] = valid
  return out
