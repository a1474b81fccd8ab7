"""Models on the device: the model registry, the bundle and its manifest, installing and verifying it."""
