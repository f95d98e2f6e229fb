"""Base models by name: their shapes read from configs (`shape`), loading (`loading`), the frozen-model cache
(`cache`) and the tiny offline test models (`tiny`)."""
