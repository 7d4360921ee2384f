"""The farm's MetaSchedule plug-ins, each what TVM's `tvm.s_tir.meta_schedule` subpackage of
the same role expects, with the parts only it uses beside it:

- builder (`builder`; `procs`: TVM's helper processes, shared with the runner; `identity`:
  what built a batch),
- runner (`runner`; `phonelog`: which phone measured what; `turns`: a key's phones serve
  batches in arrival order),
- search strategy (`search`; `baseline`: TVM's default schedule first; `inflight`: the
  batches proposed and not yet told; `firstbatch`: a borrowed model's ranked first batch;
  `transfer`: a new workload's relatives' schedules as seeds),
- cost model (`costmodel`; `features`: computed once per schedule; `samples` and `heldout`:
  what the key's model learns from, and its check on workloads it did not learn from),
- database (`database`) and measure callback (`callback`): the round's view of the store.

A round (workers/round/) assembles them; nothing here runs a round."""
