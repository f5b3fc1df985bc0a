"""Reports: training curves, the credit explorer (`explain`), the method shoot-out (`compare`)."""
