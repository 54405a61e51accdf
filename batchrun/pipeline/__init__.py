"""The road every entity travels: from where it comes (a page, a queue message, a
submitted task) to its outcome and what happens next.

engine.py     Runner: a fixed pool of workers over a bounded queue, graceful stop
stop.py       stop tokens, signals, the Lambda's deadline
pager.py      the job's keyset pages, claimed and prepared; then what other runs held
lease.py      claims, their heartbeat and the fence (claims that are lost stop the work)
work.py       one entity: fence, process, classify, settle by the job's RetryPolicy
outcomes.py   what an exception from process means (retry, fail, skip)
road.py       travel: a source's items through a bounded pool of workers
gctune.py     the garbage collector's threshold, raised while entities travel
apply.py      each outcome's ledger write and next action; settle_messages
item.py       what travels: one claimed entity or task, and the message that asked
dryrun.py     what a run would do, counted from reads only
wiring.py     what the road is handed: store, queue, effects, steering, settings
run.py        one run of a job over a period, its dry run and its hand-off
consume.py    retry, continuation and shard messages, and their dispositions
tasks.py      submitted tasks, one entity's at a time, in submission order
task_claim.py the claims a process holds for tasks; a batch's first ones, set-wise
drain.py      a consumer's batch: worked, settled and counted; failures queued again
fanout.py     a period's entities as shards on a queue
reports.py    the JSON summaries
"""
