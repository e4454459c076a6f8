"""memlib.viz: drawing only: matplotlib figures, ipywidgets and the HTML/SVG of the live calculators."""
