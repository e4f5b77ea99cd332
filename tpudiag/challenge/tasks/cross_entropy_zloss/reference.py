"""The cross_entropy_zloss task's reference: MaxText's `cross_entropy_with_logits` (taken there from
T5X's t5x/losses.py), adapted from AI-Hypercomputer/maxtext at commit 65cafbd8ad09,
MaxText/max_utils.py (Apache-2.0), with the masking of its caller (`loss_fn` in MaxText/train.py
multiplies both terms by `targets_segmentation != 0`).

Adapted: integer labels instead of one-hot targets (label < 0 is a padded row: both outputs 0, the
mask MaxText applies after the call); the logits upcast to float32 first; z_loss fixed at 1e-4
(PaLM's z-loss coefficient); the primal function only (the task grades the forward; MaxText's
custom VJP is a stabilised gradient of the same function). A solution may not import or call it."""

import jax
import jax.numpy as jnp

Z_LOSS = 1e-4


def cross_entropy_zloss(logits, labels):
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    targets = jax.nn.one_hot(jnp.clip(labels, 0, logits.shape[-1] - 1), logits.shape[-1], dtype=logits.dtype)
    logits_sum = jax.scipy.special.logsumexp(logits, axis=-1, keepdims=True)
    log_softmax = logits - logits_sum
    loss = -jnp.sum(targets * log_softmax, axis=-1)
    log_z = jnp.squeeze(logits_sum, axis=-1)
    total_z_loss = Z_LOSS * jax.lax.square(log_z)
    loss += total_z_loss
    keep = labels >= 0
    return jnp.where(keep, loss, 0.0), jnp.where(keep, total_z_loss, 0.0)
