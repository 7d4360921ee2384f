"""The phones' side: TVM RPC trackers, emulated phones (and the arm64 one under qemu), cross-compiling, the host's CPU."""
