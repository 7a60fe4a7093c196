"""A small causal transformer policy in flax nnx: token ids in, logits over the 4 answers at every position."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from examples.flax_grpo.env import CHOICES, VOCAB, WIDTH


class Block(nnx.Module):
    def __init__(self, dim: int, heads: int, rngs: nnx.Rngs):
        self.heads = heads
        self.norm1, self.norm2 = nnx.LayerNorm(dim, rngs=rngs), nnx.LayerNorm(dim, rngs=rngs)
        self.qkv = nnx.Linear(dim, 3 * dim, rngs=rngs)
        self.proj = nnx.Linear(dim, dim, rngs=rngs)
        self.up, self.down = nnx.Linear(dim, 4 * dim, rngs=rngs), nnx.Linear(4 * dim, dim, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        batch, width, dim = x.shape
        q, k, v = jnp.split(self.qkv(self.norm1(x)).reshape(batch, width, 3 * self.heads, -1), 3, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
        causal = jnp.tril(jnp.ones((width, width), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        x = x + self.proj(jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, width, dim))
        return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


class Policy(nnx.Module):
    def __init__(self, dim: int = 32, heads: int = 2, layers: int = 2, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, dim, rngs=rngs)
        self.position = nnx.Param(0.02 * jax.random.normal(rngs.params(), (WIDTH, dim)))
        self.blocks = nnx.List([Block(dim, heads, rngs) for _ in range(layers)])
        self.head = nnx.Linear(dim, CHOICES, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """``[B, T]`` token ids -> ``[B, T, 4]``: at position ``t``, logits of the answer at ``t + 1``."""
        x = self.embed(tokens) + self.position[...]
        for block in self.blocks:
            x = block(x)
        return self.head(x)
