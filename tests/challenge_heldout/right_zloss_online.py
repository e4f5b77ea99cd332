"""cross_entropy_zloss, right: an online log-sum-exp over vocabulary chunks of 256 in a fori_loop
(running max and rescaled sum), the label's logit picked in the chunk that holds it; not the
ground truth's two whole-row reductions."""
import jax
import jax.numpy as jnp

CHUNK = 256


def cross_entropy_zloss(logits, labels):
    n, v = logits.shape
    pad = -v % CHUNK
    x = jnp.pad(logits.astype(jnp.float32), ((0, 0), (0, pad)), constant_values=-jnp.inf)

    def step(c, carry):
        m, s, picked = carry
        blk = jax.lax.dynamic_slice_in_dim(x, c * CHUNK, CHUNK, axis=1)
        m_new = jnp.maximum(m, blk.max(axis=1))
        s = s * jnp.exp(m - m_new) + jnp.exp(blk - m_new[:, None]).sum(axis=1)
        cols = c * CHUNK + jnp.arange(CHUNK)
        picked = picked + jnp.where(cols[None, :] == labels[:, None], blk, 0.0).sum(axis=1)
        return m_new, s, picked

    init = (jnp.full((n,), -jnp.inf), jnp.zeros((n,)), jnp.zeros((n,)))
    m, s, picked = jax.lax.fori_loop(0, x.shape[1] // CHUNK, step, init)
    log_s = jnp.log(s)
    z = 1e-4 * jnp.square(m + log_s)
    keep = labels >= 0
    return jnp.where(keep, (m - picked) + log_s + z, 0.0), jnp.where(keep, z, 0.0)
