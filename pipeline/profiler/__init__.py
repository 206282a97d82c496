"""The profiler: measure a model run (`measure`), keep every sample in a versioned JSON
(`schema`), and render reports (`reports`) and A/B comparisons (`compare`)."""
