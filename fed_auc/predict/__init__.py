"""``fed-auc predict``: a registered model scores new images (a folder, a CSV, later a
DICOMweb query) into a CSV, and optionally one DICOM Structured Report per study.

items (what is scored: a source, an image loader, DICOM identifiers), scoring (batched, as
``fed-auc evaluate`` scores), output (the CSV's rows, each naming its model), report_sr (the
SR of one study), job (the whole job and its record in the run store).
"""
