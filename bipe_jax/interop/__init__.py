"""Interop with the Hugging Face Llama format (and the released BiPE checkpoints).

hf_files: read/write Hugging Face folders (config.json, safetensors, PyTorch .bin, shards).
hf_llama: config fields and parameter trees mapped both ways (pure NumPy).
convert: workdir <-> Hugging Face folder, and the `python -m bipe_jax.convert` CLI.
"""

from bipe_jax.interop.convert import hf_to_workdir
from bipe_jax.interop.convert import load_hf
from bipe_jax.interop.convert import workdir_to_hf
from bipe_jax.interop.hf_files import read_hf_config
from bipe_jax.interop.hf_files import read_hf_weights
from bipe_jax.interop.hf_llama import hf_config_from_model_fields
from bipe_jax.interop.hf_llama import hf_weights_from_params
from bipe_jax.interop.hf_llama import model_fields_from_hf_config
from bipe_jax.interop.hf_llama import params_from_hf_weights
