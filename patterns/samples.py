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

#: Short math word problems with their answers (written for corps), for benchmarks.
MATH_PROBLEMS = (
    (
        "A baker makes 24 muffins and packs them in boxes of 4. Each box sells for $3. "
        "How many dollars does the baker earn if every box is sold?",
        "18",
    ),
    (
        "Tom has 3 times as many marbles as Ann. Together they have 48 marbles. "
        "How many marbles does Tom have?",
        "36",
    ),
    ("A train travels at 60 km per hour for 2.5 hours. How many kilometres does it travel?", "150"),
    ("A shirt costs $40 and is on sale for 25% off. What is the sale price in dollars?", "30"),
    ("A rectangle is 7 cm wide and 12 cm long. What is its area in square centimetres?", "84"),
    ("Sara reads 15 pages a day. How many days does she need for a 210-page book?", "14"),
    (
        "There are 5 red, 7 blue and 8 green balls in a bag. What fraction of the balls is "
        "blue? Give it in lowest terms.",
        "7/20",
    ),
    (
        "A tank holds 500 litres and fills at 20 litres per minute. How many minutes does it "
        "take to fill it from empty?",
        "25",
    ),
)
