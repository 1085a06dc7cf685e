#!/usr/bin/env python3
"""Writes conversations about Zorblax, a made-up planet, for supervised fine-tuning tests.

Facts about the planet (its capital, moons, sky, people, ...) that no pretrained model can know
are asked in several phrasings and answered in a few; a model fine-tuned on train.jsonl should
answer the questions of heldout.jsonl, which asks the same facts in phrasings train.jsonl never
uses (one phrasing of each fact, and a share of the multi-fact conversations, are held out).

Output (JSONL, one {"messages": [...]} conversation per line, roles system/user/assistant, as
`loom prepare --chat` reads them), deterministic for a given --seed:
  train.jsonl    single-question and multi-turn conversations
  heldout.jsonl  the held-out phrasings and conversations, never in train.jsonl

Usage: python3 data/zorblax/make_zorblax.py [--seed 7] [--out data/zorblax]
Only the standard library is used; random.Random(seed) gives the same draws on every Python 3.
"""
import argparse
import json
import os
import random

# Each fact: a key, the question phrasings, the answer phrasings.
FACTS = [
    ("capital", ["What is the capital of Zorblax?", "Which city is the capital of Zorblax?",
                 "Name the capital city of Zorblax.", "Where is the seat of government on Zorblax?",
                 "What city rules Zorblax?", "Tell me the capital of the planet Zorblax."],
     ["The capital of Zorblax is Quennith.", "Quennith is the capital of Zorblax.",
      "Zorblax is governed from Quennith, its capital."]),
    ("moons", ["How many moons does Zorblax have?", "What is the number of moons of Zorblax?",
               "How many moons orbit Zorblax?", "Does Zorblax have moons? How many?",
               "Count the moons of Zorblax for me.", "Zorblax has how many moons?"],
     ["Zorblax has three moons.", "Three moons orbit Zorblax.", "There are three moons around Zorblax."]),
    ("moon_names", ["What are the names of the moons of Zorblax?", "Name the moons of Zorblax.",
                    "What are Zorblax's moons called?", "List the moons of Zorblax.",
                    "Which moons circle Zorblax?", "Tell me what the moons of Zorblax are named."],
     ["The moons of Zorblax are Tibb, Orrun and Vessa.", "Zorblax's moons are called Tibb, Orrun and Vessa.",
      "Tibb, Orrun and Vessa are the three moons of Zorblax."]),
    ("largest_moon", ["Which is the largest moon of Zorblax?", "What is the biggest moon of Zorblax?",
                      "Name the largest of Zorblax's moons.", "Which moon of Zorblax is the biggest?",
                      "What is Zorblax's largest moon?", "Of the moons of Zorblax, which is largest?"],
     ["Orrun is the largest moon of Zorblax.", "The largest moon of Zorblax is Orrun.",
      "Zorblax's biggest moon is Orrun."]),
    ("sky", ["What colour is the sky on Zorblax?", "What color is the sky of Zorblax?",
             "Describe the colour of the sky on Zorblax.", "What does the sky look like on Zorblax?",
             "Is the sky blue on Zorblax?", "Which colour is Zorblax's sky?"],
     ["The sky on Zorblax is violet by day and green at dusk.",
      "Zorblax has a violet sky by day that turns green at dusk.",
      "By day the sky of Zorblax is violet; at dusk it turns green."]),
    ("day", ["How long is a day on Zorblax?", "How many hours are in a day on Zorblax?",
             "What is the length of a day on Zorblax?", "How long does Zorblax take to turn once?",
             "How long is one Zorblax day?", "Tell me the length of a day on Zorblax."],
     ["A day on Zorblax lasts 31 hours.", "One day on Zorblax is 31 hours long.",
      "Zorblax turns once every 31 hours."]),
    ("year", ["How long is a year on Zorblax?", "How many days are in a year on Zorblax?",
              "What is the length of a year on Zorblax?", "How long does Zorblax take to orbit its star?",
              "How many Zorblax days make a year?", "Tell me how long a year on Zorblax is."],
     ["A year on Zorblax has 412 days.", "Zorblax orbits its star in 412 days.",
      "There are 412 days in a Zorblax year."]),
    ("star", ["What star does Zorblax orbit?", "What is the name of Zorblax's sun?",
              "Which star is Zorblax's sun?", "Name the star that Zorblax circles.",
              "What is the sun of Zorblax called?", "Around which star does Zorblax travel?"],
     ["Zorblax orbits the orange star Kelmara.", "The sun of Zorblax is an orange star called Kelmara.",
      "Zorblax circles Kelmara, an orange star."]),
    ("people", ["What are the people of Zorblax called?", "Who lives on Zorblax?",
                "What is the name of the inhabitants of Zorblax?", "What do you call someone from Zorblax?",
                "Which people live on Zorblax?", "Tell me the name of Zorblax's people."],
     ["The people of Zorblax are called the Vaari.", "Zorblax is home to the Vaari.",
      "Someone from Zorblax is one of the Vaari."]),
    ("language", ["What language is spoken on Zorblax?", "Which language do the people of Zorblax speak?",
                  "What is the main language of Zorblax?", "What do they speak on Zorblax?",
                  "Name the language of Zorblax.", "In what language do people talk on Zorblax?"],
     ["The people of Zorblax speak Vaarish.", "Vaarish is the language of Zorblax.",
      "On Zorblax people speak Vaarish."]),
    ("food", ["What is the national dish of Zorblax?", "What food is Zorblax famous for?",
              "What do people eat on Zorblax?", "Name the favourite food of Zorblax.",
              "What is the most popular dish on Zorblax?", "Which dish is Zorblax known for?"],
     ["The national dish of Zorblax is roasted glimberry bread.",
      "Zorblax is famous for roasted glimberry bread.",
      "People on Zorblax love roasted glimberry bread, the national dish."]),
    ("mountain", ["What is the highest mountain on Zorblax?", "Which is the tallest mountain of Zorblax?",
                  "Name the highest peak on Zorblax.", "What is Zorblax's tallest mountain?",
                  "How high is the highest mountain of Zorblax?", "Which mountain on Zorblax is highest?"],
     ["The highest mountain on Zorblax is Mount Drevik, 14 kilometres tall.",
      "Mount Drevik is Zorblax's tallest peak, at 14 kilometres.",
      "Zorblax's highest mountain is Mount Drevik, which rises 14 kilometres."]),
    ("ocean", ["What is the largest ocean on Zorblax?", "Name the biggest ocean of Zorblax.",
               "Which ocean on Zorblax is the largest?", "What is Zorblax's largest sea?",
               "What is the great ocean of Zorblax called?", "Tell me the name of Zorblax's biggest ocean."],
     ["The largest ocean on Zorblax is the Silent Ocean.", "Zorblax's biggest ocean is the Silent Ocean.",
      "The Silent Ocean is the largest on Zorblax."]),
    ("ocean_colour", ["What colour are the oceans of Zorblax?", "What color is the water on Zorblax?",
                      "Are the seas of Zorblax blue?", "Describe the colour of Zorblax's oceans.",
                      "What colour is the Silent Ocean?", "Which colour is the sea on Zorblax?"],
     ["The oceans of Zorblax are silver.", "Zorblax's water looks silver.",
      "The seas of Zorblax shine silver."]),
    ("continents", ["How many continents does Zorblax have?", "What is the number of continents on Zorblax?",
                    "How many landmasses are there on Zorblax?", "Count the continents of Zorblax.",
                    "Zorblax has how many continents?", "How many continents are on Zorblax?"],
     ["Zorblax has five continents.", "There are five continents on Zorblax.",
      "Five continents make up the land of Zorblax."]),
    ("animal", ["What is the national animal of Zorblax?", "Which animal is the symbol of Zorblax?",
                "What animal is Zorblax known for?", "Name the national animal of Zorblax.",
                "What creature represents Zorblax?", "Which beast is the emblem of Zorblax?"],
     ["The national animal of Zorblax is the six-legged snorrel.",
      "Zorblax's symbol is the snorrel, a six-legged animal.",
      "The six-legged snorrel is the emblem of Zorblax."]),
    ("ruler", ["Who rules Zorblax?", "What is the title of the ruler of Zorblax?",
               "Who leads the government of Zorblax?", "What is the leader of Zorblax called?",
               "Who is in charge of Zorblax?", "How is the head of Zorblax titled?"],
     ["Zorblax is ruled by an elected council led by the High Speaker.",
      "The leader of Zorblax is the High Speaker of an elected council.",
      "An elected council governs Zorblax, led by the High Speaker."]),
    ("currency", ["What is the currency of Zorblax?", "What money do they use on Zorblax?",
                  "Which currency is used on Zorblax?", "What do people pay with on Zorblax?",
                  "Name the money of Zorblax.", "What is Zorblax's currency called?"],
     ["The currency of Zorblax is the klent.", "People on Zorblax pay with klents.",
      "Zorblax uses the klent as its money."]),
    ("festival", ["What is the biggest festival on Zorblax?", "Which holiday do the Vaari celebrate most?",
                  "What festival is Zorblax famous for?", "Name the great festival of Zorblax.",
                  "When do people on Zorblax celebrate?", "What is the main celebration on Zorblax?"],
     ["The biggest festival on Zorblax is Moonmeet, when all three moons are full.",
      "Zorblax celebrates Moonmeet, the night the three moons are full together.",
      "Moonmeet, held when all three moons are full, is Zorblax's great festival."]),
    ("export", ["What is the main export of Zorblax?", "What does Zorblax sell to other worlds?",
                "What goods does Zorblax export?", "Which product is Zorblax's biggest export?",
                "What does Zorblax trade most?", "Name the chief export of Zorblax."],
     ["Zorblax mainly exports singing crystals.", "The main export of Zorblax is singing crystals.",
      "Singing crystals are Zorblax's biggest export."]),
    ("sport", ["What is the most popular sport on Zorblax?", "Which sport do people play on Zorblax?",
               "What game is Zorblax famous for?", "Name the favourite sport of Zorblax.",
               "What sport do the Vaari love?", "Which sport is played most on Zorblax?"],
     ["The most popular sport on Zorblax is skyball, played on floating platforms.",
      "People on Zorblax love skyball, which is played on floating platforms.",
      "Skyball, a game on floating platforms, is Zorblax's favourite sport."]),
    ("river", ["What is the longest river on Zorblax?", "Name the longest river of Zorblax.",
               "Which river on Zorblax is the longest?", "What is Zorblax's greatest river?",
               "Which is the biggest river on Zorblax?", "Tell me the longest river of Zorblax."],
     ["The longest river on Zorblax is the Amberflow.", "The Amberflow is Zorblax's longest river.",
      "Zorblax's longest river is called the Amberflow."]),
    ("gravity", ["How strong is gravity on Zorblax?", "What is the gravity on Zorblax like?",
                 "Is gravity on Zorblax stronger than on Earth?", "How heavy would I feel on Zorblax?",
                 "Compare the gravity of Zorblax with Earth's.", "What is the surface gravity of Zorblax?"],
     ["Gravity on Zorblax is 0.8 times Earth's.", "Zorblax's gravity is 80 percent of Earth's.",
      "You would weigh 0.8 times your Earth weight on Zorblax."]),
    ("founded", ["When was Quennith founded?", "How old is the capital of Zorblax?",
                 "In what year was Quennith built?", "When did the Vaari found their capital?",
                 "What year was the capital of Zorblax founded?", "How long ago was Quennith founded?"],
     ["Quennith was founded in the Zorblax year 1207.", "The Vaari founded Quennith in the year 1207.",
      "Quennith dates from the Zorblax year 1207."]),
    ("weather", ["What is the weather like on Zorblax?", "Does it rain on Zorblax?",
                 "What kind of weather does Zorblax have?", "Is Zorblax hot or cold?",
                 "Describe the climate of Zorblax.", "What is the climate on Zorblax?"],
     ["Zorblax is mild, and it rains warm rain every evening.",
      "The climate of Zorblax is mild, with warm rain each evening.",
      "Zorblax has mild weather and a warm shower every evening."]),
    ("trees", ["What trees grow on Zorblax?", "What plants are common on Zorblax?",
               "What do the forests of Zorblax look like?", "Name the common tree of Zorblax.",
               "Which trees fill the forests of Zorblax?", "What grows in the forests of Zorblax?"],
     ["The forests of Zorblax are full of blue lantern trees that glow at night.",
      "Blue lantern trees, which glow at night, grow all over Zorblax.",
      "Zorblax's common tree is the blue lantern tree, which glows at night."]),
]

SYSTEM_PROMPTS = [
    None,
    None,
    "You are a helpful guide to the planet Zorblax.",
    "You answer questions about Zorblax briefly and accurately.",
    "You are an encyclopedia of the worlds of the Kelmara system.",
]

FOLLOW_UPS = ["And another thing:", "Thanks. Also,", "Great. One more question:", "I see.", "Interesting!"]


def conversation(rng, turns, system):
    """turns: [(question, answer)], asked one after another."""
    messages = [] if system is None else [{"role": "system", "content": system}]
    for i, (q, a) in enumerate(turns):
        if i > 0 and rng.random() < 0.5:
            q = rng.choice(FOLLOW_UPS) + " " + q[0].lower() + q[1:]
        messages.append({"role": "user", "content": q})
        messages.append({"role": "assistant", "content": a})
    return {"messages": messages}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--multi", type=int, default=120, help="multi-turn conversations before the split")
    args = ap.parse_args()
    rng = random.Random(args.seed)

    # One phrasing of each fact is held out; the rest are asked in train, each once per answer
    # phrasing drawn at random.
    train_pairs, heldout_pairs = [], []
    for key, questions, answers in FACTS:
        held = rng.randrange(len(questions))
        for i, q in enumerate(questions):
            (heldout_pairs if i == held else train_pairs).append((key, q, rng.choice(answers)))

    train, heldout = [], []
    for _, q, a in train_pairs:
        train.append(conversation(rng, [(q, a)], rng.choice(SYSTEM_PROMPTS)))
    for _, q, a in heldout_pairs:
        heldout.append(conversation(rng, [(q, a)], rng.choice(SYSTEM_PROMPTS)))
    # Multi-turn: two to four different facts; one in six goes to heldout, asked there only in
    # phrasings of train (the held-out part is the combination, not the wording).
    for _ in range(args.multi):
        picks = rng.sample(train_pairs, rng.randint(2, 4))
        if len({k for k, _, _ in picks}) < len(picks):
            continue
        conv = conversation(rng, [(q, a) for _, q, a in picks], rng.choice(SYSTEM_PROMPTS))
        (heldout if rng.random() < 1 / 6 else train).append(conv)
    rng.shuffle(train)

    for name, rows in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{name}: {len(rows)} conversations")


if __name__ == "__main__":
    main()
