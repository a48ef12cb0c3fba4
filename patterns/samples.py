"""Small built-in inputs, so every pattern runs with no arguments."""

from __future__ import annotations

QUESTION = (
    "A baker makes 24 muffins and packs them in boxes of 4. Each box sells for $3. "
    "How many dollars does the baker earn if every box is sold?"
)
QUESTIONS = ("What is the capital of France?", "What is 7 times 6?")
ANSWERS = ("Paris", "42")
CONCEPTS = (
    "dog",
    "frisbee",
    "park",
    "rain",
    "umbrella",
    "bakery",
    "bicycle",
    "river",
    "guitar",
    "lantern",
    "garden",
    "train",
    "kite",
    "library",
    "snow",
    "market",
)
DOCUMENT_PARAGRAPHS = (
    "The town of Alder Creek grew up around a sawmill built beside a fast, cold river. "
    "For its first decades almost every family depended on the mill, which ran from spring "
    "thaw to the first hard frost and fell silent through the long winters.",
    "When the railway arrived, the mill began shipping boards to cities far to the south. "
    "Wages rose, a school and a library were built, and the main street filled with shops "
    "selling tools, cloth, and tinned food brought up by the trains.",
    "A fire in the dry summer of the mill's fortieth year destroyed the main saw shed. The "
    "owners rebuilt it in brick, added steam engines, and for the first time the mill could "
    "run through the winter, which changed the rhythm of life in the town.",
    "As the nearby forests thinned, logs had to be hauled from farther away, and costs "
    "climbed. Younger people began leaving for factory work in the cities, and the school "
    "merged with one in the next valley.",
    "The mill closed for good after a long strike and a fall in timber prices. For a few "
    "years the town seemed likely to empty, and many houses stood shuttered along the river.",
    "Recovery came slowly from visitors rather than timber. Anglers came for the trout in "
    "the river, walkers for the old logging trails, and the brick saw shed became a museum "
    "and a market hall that opens every weekend.",
)
DOCUMENT = "\n\n".join(DOCUMENT_PARAGRAPHS * 6)  # a few thousand tokens
