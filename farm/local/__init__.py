"""Processes on this machine: starting and stopping Redis, trackers, phones and workers, and the embedded farm made of them."""
