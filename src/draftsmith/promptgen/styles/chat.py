"""The `chat` style: project-written requests, templates x everyday subjects x tone
variants; held out by subject."""

from __future__ import annotations

import re
from collections.abc import Iterator

from draftsmith.promptgen.docstrings import held_out
from draftsmith.promptgen.styles.common import CHAT_HELDOUT_SHARE, GENERATOR, Candidate

# Activities are gerund phrases ("... tips for {s}"), topics noun phrases ("explain {s}").
ACTIVITY_TEMPLATES = (
    "What are five practical tips for {s}?",
    "I want to get started with {s}. What should I do in my first week?",
    "What mistakes do people often make when {s}, and how can I avoid them?",
    "Make a simple four-week plan to help me get better at {s}.",
    "A friend says {s} is a waste of time. Help me write a friendly reply explaining why I enjoy it.",
    "What do I really need to buy for {s}, and what can I skip?",
    "How can I fit {s} into a busy week with a full-time job?",
    "Give me a short checklist to go through before {s}.",
    "What are the pros and cons of {s}?",
    "Is {s} better done alone or with other people? Compare the two.",
    "How can I keep {s} cheap when money is tight?",
    "Write a short, encouraging message to a friend who is nervous about {s}.",
    "How can I tell whether I am making progress at {s}?",
    "What is a realistic goal for a beginner at {s} after three months?",
    "Explain to a ten-year-old why someone might enjoy {s}.",
    "What should someone starting in their sixties keep in mind about {s}?",
)
TOPIC_TEMPLATES = (
    "Explain {s} in simple terms.",
    "What are some common misconceptions about {s}?",
    "Give me three surprising facts about {s}.",
    "Write a short poem about {s}.",
    "How would you explain {s} to a curious eight-year-old?",
    "Write a one-paragraph piece about {s} for a school newsletter.",
    "What makes {s} worth knowing about in everyday life?",
    "Compare how people understood {s} a century ago with how it is understood today.",
    "Write three quiz questions about {s}, with their answers.",
    "What is still debated or not well understood about {s}?",
    "Suggest a short reading and viewing plan for someone who wants to learn about {s}.",
    "Describe {s} in exactly five sentences.",
    "Write the opening paragraph of a magazine article about {s}.",
    "What would be a good analogy for explaining {s}?",
    "List the key terms someone needs to understand {s}, with a one-line definition each.",
    "Turn {s} into an idea for a short children's story.",
)
GENERAL_TEMPLATES = (
    "Write a short, friendly email inviting a colleague to a lunchtime talk about {s}.",
    "Rewrite this message so it sounds polite and warm: 'I need your notes on {s} by "
    "tomorrow. Don't forget.'",
    "Rewrite this sentence in plain English: 'Engagement with {s} necessitates considerable "
    "preliminary deliberation on the part of the individual.'",
    "Suggest three catchy titles for a blog post about {s}.",
    "Write a haiku about {s}.",
    "Summarise in three bullet points what a beginner should know about {s}.",
    "Write a short dialogue between two friends talking about {s}.",
    "Plan a one-hour evening workshop for adults about {s}: give a timed agenda.",
    "What are good questions to ask an expert on {s}?",
    "Write a one-sentence tip about {s} that would fit on a postcard.",
)
ACTIVITIES = (
    # cooking
    "baking bread at home", "cooking meals for the week ahead", "making soup from leftovers",
    "cooking with spices", "grilling vegetables", "making fresh pasta", "fermenting vegetables",
    "brewing coffee at home", "packing healthy school lunches", "cooking for a big family gathering",
    # travel
    "travelling with only a carry-on bag", "planning a road trip", "travelling across Europe by train",
    "camping with young children", "visiting a big city on a small budget",
    "learning a few phrases before a trip abroad", "travelling alone for the first time",
    "hiking in the mountains", "travelling with a dog", "planning a weekend away",
    # health habits
    "walking every day", "stretching every morning", "drinking more water", "going to bed earlier",
    "cutting down on sugar", "starting to run", "swimming for fitness", "doing yoga at home",
    "taking breaks from screens", "cooking with less salt",
    # money
    "keeping a monthly budget", "saving for a holiday", "paying off a credit card",
    "shopping for groceries on a budget", "selling things you no longer need",
    "choosing a mobile phone plan", "saving for retirement", "splitting bills with flatmates",
    "tracking daily spending", "buying a used car",
    # work
    "preparing for a job interview", "running a short team meeting", "writing clear work emails",
    "asking for a pay rise", "working from home", "giving a presentation",
    "learning a new software tool", "mentoring a new colleague", "changing careers",
    "keeping a shared calendar in order",
    # hobbies
    "learning to play the guitar", "knitting a scarf", "starting a vegetable garden",
    "taking photos with a phone", "drawing with pencils", "learning chess", "building model trains",
    "birdwatching", "keeping a personal journal", "learning to juggle", "painting with watercolours",
    "doing jigsaw puzzles", "keeping houseplants alive", "learning a new language", "singing in a choir",
    # home
    "decluttering a small flat", "repainting a bedroom", "fixing a dripping tap",
    "composting kitchen scraps", "cleaning the kitchen quickly", "organising a garage",
    "reducing household energy use", "putting up shelves", "washing wool jumpers",
    "moving to a new house",
    # family and friends
    "hosting a dinner party", "planning a child's birthday party", "staying in touch with old friends",
    "teaching a child to ride a bike", "volunteering at a food bank", "meeting people in a new city",
    "writing thank-you notes", "caring for an elderly parent", "raising a puppy",
    "reading aloud to children",
    # outdoors
    "identifying trees on a walk", "stargazing without a telescope", "picking wild blackberries",
    "keeping bees", "feeding garden birds in winter", "cleaning up litter on a beach",
    # learning
    "studying for an exam", "reading more books", "learning to type faster",
    "memorising a poem", "taking notes in lectures", "learning basic first aid",
)  # fmt: skip
TOPICS = (
    # science
    "the water cycle", "photosynthesis", "how rainbows form", "the phases of the Moon",
    "static electricity", "the tides", "how vaccines work", "black holes", "the greenhouse effect",
    "plate tectonics", "how magnets work", "the human heart", "dreaming", "the immune system",
    "gravity", "the speed of light", "DNA", "volcanic eruptions", "earthquakes", "the seasons",
    "how aeroplanes stay in the air", "the periodic table", "gut bacteria", "how a fridge works",
    "the northern lights",
    # history
    "the printing press", "Roman roads", "the invention of the telephone", "the Silk Road",
    "the Great Fire of London", "the Egyptian pyramids", "the first Moon landing",
    "the history of chocolate", "the Industrial Revolution", "the Vikings", "the history of tea",
    "the invention of paper", "the building of the Panama Canal", "medieval castles",
    "the history of the bicycle", "the ancient Olympic Games", "the fall of the Berlin Wall",
    "the history of the calendar", "the Renaissance", "early photography",
    # nature
    "migrating birds", "coral reefs", "honeybees", "rainforests", "octopuses", "the life of a tree",
    "deserts at night", "wolves", "mushrooms in the forest", "whales", "rock pools", "earthworms",
    "sunflowers", "glaciers", "bats",
    # money and the economy
    "compound interest", "inflation", "how banks make money", "credit scores", "the stock market",
    "home insurance", "supply and demand", "income tax", "cryptocurrency", "the history of money",
    # health and the body
    "sleep cycles", "the benefits of walking", "vitamin D", "jet lag", "caffeine", "good posture",
    "hydration", "muscle soreness after exercise", "the common cold", "hearing and loud noise",
    # culture, arts and food
    "jazz", "haiku poetry", "the modern Olympic Games", "street food", "origami", "the orchestra",
    "board games", "opera", "sourdough starters", "spices from around the world", "cheese making",
    "bridge design", "comic books", "folk tales", "chess openings",
    # technology
    "the internet", "password safety", "satellite navigation", "solar panels", "electric cars",
    "3D printing", "plastic recycling", "wind turbines", "email spam", "smartphone batteries",
)  # fmt: skip
# Tone variants: each template and subject is asked in these few ways.
CHAT_VARIANTS = ("", " Please keep it short.", " Use plain, friendly language.")
# (template, whether it takes activities, whether it takes topics); indices are provenance.
CHAT_TEMPLATES = (
    tuple((t, True, False) for t in ACTIVITY_TEMPLATES)
    + tuple((t, False, True) for t in TOPIC_TEMPLATES)
    + tuple((t, True, True) for t in GENERAL_TEMPLATES)
)


def chat_candidates() -> Iterator[Candidate]:
    """Every fitting template x subject x variant; held out by subject."""
    subjects = [(s, True) for s in ACTIVITIES] + [(s, False) for s in TOPICS]
    for index, (template, activities, topics) in enumerate(CHAT_TEMPLATES):
        for subject, is_activity in subjects:
            if not (activities if is_activity else topics):
                continue
            held = held_out(subject, CHAT_HELDOUT_SHARE)
            for variant, tone in enumerate(CHAT_VARIANTS):
                row = {"id": f"chat-{index:02d}-{variant}-{_slug(subject)}", "source": "generator"}
                provenance = {"generator": f"{GENERATOR}.chat", "template": index, "variant": variant}
                prompt = template.format(s=subject) + tone
                yield Candidate(held, row | {"prompt": prompt} | provenance | {"subject": subject})


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.casefold()).strip("-")
