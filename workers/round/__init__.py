"""One measuring round of one workload on a worker host: the search (`search`, `costmodel`,
`transfer`), building (`builder`, `procs`), rounds at once and hand-off to idle hosts (`gate`,
`handoff`), measuring on the phones (`runner`, `turns`,
`phonelog`), committing to the store (`callback`, `database`), the round itself
(`measure`), and re-measuring stored bests for `farm cache verify` (`verify`)."""
