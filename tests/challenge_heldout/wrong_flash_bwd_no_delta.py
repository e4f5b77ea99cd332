"""flash_attention_bwd, subtly wrong: a custom VJP whose forward is right but whose backward forms
ds = p * dp without subtracting rowsum(do * o), the softmax's own term: the output passes, dq and dk
do not (dv is right)."""
import jax
import jax.numpy as jnp


def _scores(q, k):
    groups = q.shape[1] // k.shape[1]
    s = jnp.einsum("bhqd,bhkd->bhqk", q, jnp.repeat(k, groups, axis=1), preferred_element_type=jnp.float32)
    s = s / jnp.sqrt(q.shape[-1]).astype(jnp.float32)
    mask = jnp.arange(k.shape[2])[None, :] <= jnp.arange(q.shape[2])[:, None]
    return jnp.where(mask, s, -jnp.inf), groups


@jax.custom_vjp
def flash_attention(q, k, v):
    return _fwd(q, k, v)[0]


def _fwd(q, k, v):
    s, groups = _scores(q, k)
    lse = jax.nn.logsumexp(s, axis=-1, keepdims=True)
    p = jnp.exp(s - lse).astype(v.dtype)
    o = jnp.einsum("bhqk,bhkd->bhqd", p, jnp.repeat(v, groups, axis=1), preferred_element_type=jnp.float32)
    return o.astype(q.dtype), (q, k, v, lse)


def _bwd(res, do):
    q, k, v, lse = res
    s, groups = _scores(q, k)
    p = jnp.exp(s - lse)
    do = do.astype(jnp.float32)
    vv = jnp.repeat(v, groups, axis=1).astype(jnp.float32)
    dv = jnp.einsum("bhqk,bhqd->bhkd", p, do)
    ds = p * jnp.einsum("bhqd,bhkd->bhqk", do, vv) / jnp.sqrt(q.shape[-1])  # missing: - rowsum(do * o)
    dq = jnp.einsum("bhqk,bhkd->bhqd", ds, jnp.repeat(k, groups, axis=1).astype(jnp.float32))
    dk = jnp.einsum("bhqk,bhqd->bhkd", ds, q.astype(jnp.float32))
    fold = lambda x: x.reshape(x.shape[0], -1, groups, *x.shape[2:]).sum(axis=2)
    return dq.astype(q.dtype), fold(dk).astype(k.dtype), fold(dv).astype(v.dtype)


flash_attention.defvjp(_fwd, _bwd)
