"""What mailbox providers report back: SES bounces and complaints from an SQS queue,
applied to the suppression list and the ledger (``batchrun events``, the Lambda)."""
