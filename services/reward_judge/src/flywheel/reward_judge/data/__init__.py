"""Data shipped with the judge: the labelled preference pairs used for calibration."""
