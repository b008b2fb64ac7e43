"""What a run's raw data says, in numbers (nothing here draws): its statistics per cell and per
case, the cost of enforcement and where the time goes (stats.py, with pandas), a model of the
testbed (model.py: each part's CPU cost per record in a simpy simulation of a record's path) and
the model put to a run (model_predict.py: calibrated on its cells, predicting this machine and
the paper's testbed).

Above design/ (a run's cells and cases) and load/ (the columns a request's row carries); below
the reports, which show what it finds."""
