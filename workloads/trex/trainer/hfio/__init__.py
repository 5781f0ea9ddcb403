"""Sharded Hugging Face safetensors loading: each rank reads only the boxes of the stored tensors that its
local shards hold (trex.trainer.hfio.load), through a counting slice reader (trex.trainer.hfio.reader)."""
