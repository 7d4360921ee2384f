"""A tuning task's TIR workload as both sides read it: its module back from TVM JSON
(`module.load_mod`) and its blocks named by their place, so records apply across models
(`blocknames`)."""
