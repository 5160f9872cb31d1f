"""Rollout engines: one interface (`engine.RolloutEngine`), served by an SGLang server over HTTP (`sglang.py`,
`http.py`) or by the embedded JAX sampler on the models' KV-cache path (`embedded.py`, the default on CPU and in
tests). See `engine.py` for the conventions every engine follows (SGLang's: prompt-major results, the stop token
included in the output, logprobs of the sampling distribution, a weight version per sample).
"""
