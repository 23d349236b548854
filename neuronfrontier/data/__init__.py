"The data: the organisers' shards and tokenizer, the rows each rank trains on, the scorer's bits per byte."
