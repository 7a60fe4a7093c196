"""The native CPU kernels: ``build`` (compile, cache, lock, verify) and ``ffi`` (register, call, and
``use_native``, the one policy deciding when they are used). Below the kernels: ``prm_jax.kernels`` calls
them; nothing here imports the kernels."""
