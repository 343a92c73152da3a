"""`rayparallel predict` (inference): a trained model's predictions for a job's rows, on the cluster's workers.

The driver finds the rows (`source`), loads the weights once and checks them against the
model, and hands the work out: stateful streams to one Ray task per worker, each carrying its
streams' states window after window (`streams`); stateless rows through Ray Data to a pool of
replicas (`replicas`). It writes the predictions as Parquet with the rows' keys (`output`) and
records the run (`run`).
"""
