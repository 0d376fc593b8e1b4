"""`python -m bipe_jax.convert --from DIR --to DIR`: see bipe_jax.interop.convert."""
from bipe_jax.interop import convert
if __name__ == '__main__':
  raise SystemExit(convert.main())
