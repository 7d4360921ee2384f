"""One measuring round of one workload on a worker host, built from MetaSchedule's plug-ins
(workers/metaschedule/): the round itself (`measure`, `rounds`), its batch loop (`loop`,
`tuning`), what a worker process keeps warm (`context`), the CPU account (`account`), rounds
at once and hand-off to idle hosts (`gate`, `handoff`), lending a round's search and builds
to a helper host (`lend/`), and re-measuring stored bests for `farm cache verify`
(`verify`)."""
