"""Pooling kernels: the binds (:mod:`.binds`) and their compiled 2-d loops (:mod:`.loops`)."""
