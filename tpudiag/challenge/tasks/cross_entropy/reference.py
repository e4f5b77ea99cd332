"""The cross_entropy task's reference: tpudiag.kernels.cross_entropy.reference, as written there
(jax.nn.log_softmax in float32, or float64 in float64; a negative label gives loss 0). A solution
may not import or call it."""

import jax
import jax.numpy as jnp


def cross_entropy(logits, labels):
    x = logits if logits.dtype == jnp.float64 else logits.astype(jnp.float32)
    logp = jax.nn.log_softmax(x, axis=-1)
    picked = jnp.take_along_axis(logp, jnp.clip(labels, 0, x.shape[1] - 1)[:, None], axis=-1)[:, 0]
    return jnp.where(labels >= 0, -picked, 0.0)
