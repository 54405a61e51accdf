"""The road every entity travels: from where it comes (a page, a queue message, a
submitted task) to its outcome and what happens next.

engine.py     Runner: a fixed pool of workers over a bounded queue, graceful stop
stop.py       stop tokens, signals, the Lambda's deadline
pager.py      the job's keyset pages, claimed and prepared; then what other runs held
lease.py      claims, their heartbeat and the fence (claims that are lost stop the work)
work.py       one entity: fence, process, classify, settle by the job's RetryPolicy
outcomes.py   what an exception from process means (retry, fail, skip)
recorder.py   group commit of outcomes; one retry message per entity
run.py        one run of a job over a period, its dry run and its hand-off
consume.py    retry, task, continuation and shard messages, and their verdicts
fanout.py     a period's entities as shards on a queue
reports.py    the JSON summaries
"""
