"""The word lists the training prompts are built from, written for this project (no benchmark's text): topics by
domain, and the fillers each task template draws on. Order matters: the generator samples from these lists with a
seeded RNG, so editing a list changes train.jsonl (regenerate it: python -m eaglekit.train.prompts)."""

TOPICS: dict[str, list[str]] = {
    "science": ["black holes", "the water cycle", "DNA", "volcanoes", "magnetism", "the speed of light",
                "chemical reactions", "the periodic table", "earthquakes", "gravity", "evolution", "the human heart",
                "static electricity", "rainbows", "fossils", "the immune system"],
    "history": ["the Roman Empire", "ancient Egypt", "the Industrial Revolution", "the Viking Age",
                "the invention of writing", "the Great Wall of China", "the Aztec Empire", "the Cold War",
                "the first moon landing", "medieval castles", "the Ottoman Empire", "the abolition of slavery",
                "ancient Greek democracy", "the age of exploration", "the Meiji era in Japan"],
    "cooking": ["baking bread", "making pasta from scratch", "fermented foods", "spices", "grilling vegetables",
                "knife skills", "making soup", "baking cookies", "cooking rice", "herbs in the kitchen",
                "food safety at home", "breakfast ideas", "vegetarian meals", "making pancakes"],
    "travel": ["traveling by train", "packing light", "visiting Japan", "camping in the mountains",
               "road trips", "traveling on a budget", "visiting museums abroad", "island holidays",
               "learning phrases before a trip", "jet lag", "hostels", "traveling with children", "city walking tours",
               "visiting Iceland"],
    "programming": ["Python lists", "recursion", "version control with git", "unit testing", "variables",
                    "functions", "loops", "debugging", "databases", "APIs", "object-oriented programming",
                    "regular expressions", "sorting algorithms", "hash tables", "JSON files", "error handling"],
    "sports": ["soccer", "basketball", "swimming", "marathon running", "tennis", "cycling", "chess",
               "yoga", "rock climbing", "volleyball", "skiing", "table tennis", "the Olympic Games", "cricket"],
    "health": ["sleep", "drinking enough water", "stretching", "healthy snacks", "stress", "walking every day",
               "posture at a desk", "washing hands", "eating vegetables", "screen time", "breathing exercises",
               "a balanced breakfast", "sunscreen", "taking breaks at work"],
    "finance": ["saving money", "budgeting", "interest rates", "credit cards", "inflation", "emergency funds",
                "compound interest", "taxes", "buying a used car", "renting versus buying a home",
                "comparing prices", "pocket money for kids", "paying off debt", "retirement savings"],
    "arts": ["watercolor painting", "photography", "learning the guitar", "sculpture", "street art",
             "poetry", "jazz", "theater", "drawing portraits", "film making", "ballet", "pottery",
             "classical music", "comic books"],
    "everyday life": ["cleaning a kitchen", "keeping houseplants alive", "morning routines", "moving to a new city",
                      "making friends as an adult", "organizing a closet", "grocery shopping", "recycling",
                      "being on time", "keeping a journal", "hosting a dinner party", "walking a dog",
                      "saving energy at home", "doing laundry"],
    "nature": ["honeybees", "rainforests", "whales", "deserts", "migrating birds", "coral reefs", "mushrooms",
               "wolves", "oak trees", "penguins", "rivers", "butterflies", "octopuses", "thunderstorms"],
    "technology": ["smartphones", "the internet", "electric cars", "3D printing", "batteries", "robots",
                   "satellites", "passwords", "cloud storage", "video calls", "GPS", "wind turbines",
                   "email", "computer memory"],
    "geography": ["mountains", "the Amazon River", "the Sahara", "islands", "time zones", "the Arctic", "maps",
                  "capital cities", "the Nile", "the Alps", "glaciers", "the Pacific Ocean", "lakes"],
    "literature": ["fairy tales", "mystery novels", "Shakespeare's plays", "science fiction", "fables",
                   "myths of ancient Greece", "poetry forms", "writing a diary", "libraries", "comic strips",
                   "children's picture books", "biographies"],
    "work and school": ["job interviews", "taking notes in class", "working from home", "time management",
                        "group projects", "public speaking", "writing a resume", "studying for exams",
                        "asking for a raise", "team meetings", "learning a new skill", "giving feedback"],
}

AUDIENCES = ["a ten-year-old", "a complete beginner", "my grandmother", "a high school student",
             "someone who has never heard of it", "a busy adult with five minutes"]
LENGTHS = ["in one sentence", "in two or three sentences", "in a short paragraph", "in about 100 words",
           "in simple words"]
POEM_FORMS = ["a haiku", "a four-line poem", "a short rhyming poem", "a limerick", "a free-verse poem of six lines",
              "an acrostic poem"]
MOODS = ["cheerful", "calm", "funny", "hopeful", "slightly sad", "mysterious"]

CHARACTERS = ["a shy librarian", "a young inventor", "an old fisherman", "a lost puppy", "a curious robot",
              "a girl who can talk to birds", "a retired astronaut", "a baker who never sleeps", "a clumsy dragon",
              "two best friends", "a new student", "a grumpy cat", "a forgetful wizard's apprentice",
              "a lighthouse keeper", "a talking bicycle", "a family of mice", "a street musician",
              "a nervous goalkeeper"]
SITUATIONS = ["finds a mysterious map", "gets lost in a big city", "has to win a cooking contest",
              "discovers a door that was not there yesterday", "must deliver a letter before sunset",
              "meets a stranger on a train", "tries to fix a broken clock", "wakes up with a new talent",
              "is stuck in an elevator", "plants a seed that grows overnight", "enters a talent show",
              "learns to say sorry", "finds a wallet on the street", "is afraid of the dark",
              "goes to the sea for the first time"]

RECIPIENTS = ["my manager", "a teacher", "a coworker", "my landlord", "a customer", "a friend",
              "the school principal", "a hotel", "a local newspaper", "my team"]
EMAIL_SUBJECTS = ["asking for a day off next Friday", "thanking them for their help last week",
                  "rescheduling a meeting to Thursday", "a late delivery", "inviting them to a birthday party",
                  "a noisy neighbor", "asking for feedback on a report", "a mistake on an invoice",
                  "welcoming a new member to the team", "confirming a booking for two nights",
                  "apologizing for missing a call", "proposing a team lunch"]

HOW_TO = ["boil an egg", "change a flat bicycle tire", "plant tomatoes", "clean a laptop keyboard",
          "make a cup of tea", "start a vegetable garden on a balcony", "write a thank-you card",
          "set up a monthly budget", "learn to juggle", "make a paper airplane", "brew coffee with a French press",
          "prepare for a job interview", "iron a shirt", "back up photos from a phone", "sew on a button",
          "wrap a gift neatly", "start running as a beginner", "make a smoothie", "clean a fish tank",
          "write a short speech", "organize a bookshelf", "remove a coffee stain", "memorize a poem",
          "teach a dog to sit", "fold a fitted sheet", "create a strong password", "make homemade lemonade",
          "plan a picnic", "repot a plant", "meditate for five minutes"]

DISHES = ["tomato soup", "banana bread", "a vegetable stir-fry", "guacamole", "pancakes", "fried rice",
          "a lentil curry", "a Greek salad", "oatmeal cookies", "a simple omelette", "roasted potatoes",
          "hummus", "a fruit salad", "garlic bread", "a bean chili", "mashed potatoes"]
PLACES = ["Lisbon", "Kyoto", "Cape Town", "Vancouver", "Marrakesh", "Buenos Aires", "Prague", "Hanoi",
          "Reykjavik", "Sydney", "Istanbul", "Mexico City", "Edinburgh", "Nairobi", "Seoul", "Lima"]

ROLES = [("a friendly librarian", "Recommend me a book for a rainy weekend."),
         ("a ship's captain in a storm", "Tell your crew what to do."),
         ("a city guide in Paris", "Describe the view from the top of a tall tower."),
         ("a kind veterinarian", "My cat stopped eating today. What questions would you ask me?"),
         ("a football coach at half time", "Your team is losing 2-0. Give a short talk."),
         ("a news reporter", "Report on a town festival where a giant pumpkin won first prize."),
         ("a medieval blacksmith", "Explain to a customer how you make a sword."),
         ("a time traveler from the year 2300", "Describe what a normal school day is like."),
         ("a grumpy old wizard", "A student asks you to teach them their first spell."),
         ("a park ranger", "Explain the rules of the park to a group of campers."),
         ("a chef in a busy kitchen", "Teach a new cook how to chop an onion."),
         ("an alien visiting Earth", "Describe a supermarket to your friends back home."),
         ("a patient math tutor", "Help me understand what a fraction is."),
         ("a detective", "Explain how you solved the case of the missing bicycle."),
         ("a flight attendant", "Give the safety briefing in a friendly and funny way."),
         ("a museum curator", "Introduce the dinosaur skeleton in the main hall."),
         ("a job interviewer", "Ask me three questions for a cashier position."),
         ("a wise grandmother", "Give advice to a grandchild leaving home for the first time."),
         ("a sports commentator", "Describe the last minute of a tied basketball game."),
         ("a helpful hotel receptionist", "A guest says their room is too cold. Respond."),
         ("Santa's busiest elf", "Explain how the toy workshop runs in December."),
         ("a gardener", "Tell me which vegetables are easiest to grow in spring."),
         ("a lifeguard", "Explain beach safety rules to a group of children."),
         ("a robot butler", "Announce tonight's dinner menu.")]

PY_TASKS = ["returns the sum of all even numbers in a list", "reverses a string", "checks whether a number is prime",
            "counts how often each word appears in a sentence", "returns the second smallest value in a list",
            "converts a number of seconds into minutes and seconds", "checks whether two words are anagrams",
            "returns the n-th Fibonacci number", "flattens a list of lists", "finds the most common letter in a text",
            "converts kilometers to miles", "returns the median of a list of numbers",
            "capitalizes the first letter of every word in a sentence",
            "checks that a date string looks like YYYY-MM-DD",
            "removes all spaces from a string", "returns a list of the cubes of 1 to n",
            "merges two sorted lists into one sorted list", "checks whether a list is sorted",
            "counts the lines in a text file", "returns the greatest common divisor of two numbers",
            "converts a list of strings to upper case", "finds all numbers in a list that are greater than 10",
            "returns the number of days between two dates", "rounds a price to two decimal places and adds a "
            "dollar sign", "checks whether a string contains only digits", "splits a full name into first and "
            "last name", "returns the average word length of a sentence", "groups a list of words by their "
            "first letter", "prints a multiplication table for a number", "swaps the keys and values of a "
            "dictionary", "reads a CSV file and returns the number of rows", "generates a random password of a "
            "given length", "checks whether a number is a perfect square", "returns the digits of an integer as "
            "a list", "counts the uppercase letters in a string", "finds the index of the smallest item in a list"]
PY_EXTRAS = ["", " Include a docstring.", " Add a short example of how to call it.", " Explain how it works.",
             " Keep it short.", " Use type hints."]

PARAGRAPHS = [
    "The town of Greenhill built a new footbridge over the river last spring. Before that, people walked twenty "
    "minutes to the old road bridge. Now children reach school in five minutes, and the cafe on the far bank "
    "says it has twice as many customers on weekends.",
    "Maya started learning the violin at the age of forty. At first she practiced for ten minutes a day and "
    "found it frustrating. After a year of steady practice she joined a community orchestra, where she says "
    "she has made some of her closest friends.",
    "A small company switched to a four-day work week as a trial. Over six months, staff reported less stress "
    "and took fewer sick days. The amount of work finished stayed about the same, so the company decided to "
    "keep the new schedule.",
    "Honeybees tell each other where food is by dancing. A bee returning to the hive moves in a figure-eight "
    "pattern, and the angle of its dance shows the direction of the flowers compared with the sun. The length "
    "of the dance hints at the distance.",
    "The city library now lends more than books. Visitors can borrow tools, board games, musical instruments "
    "and even cake tins. The librarians say the idea saves people money and means fewer things are bought "
    "once and then forgotten in a cupboard.",
    "Last winter a heavy storm knocked out power in the valley for three days. Neighbors shared firewood, "
    "cooked together on gas stoves and checked on older residents. Many said the storm made the community "
    "feel closer than it had in years.",
    "Rice is the main food for more than half of the people in the world. It grows best in warm places with "
    "plenty of water, and many farmers grow it in flooded fields called paddies. The water helps keep weeds "
    "and pests away from the young plants.",
    "A local school replaced its vending machines with a fruit stand run by students. Sales were slow in the "
    "first month, but after the students added smoothies and a loyalty card, the stand began to make a small "
    "profit that now pays for sports equipment.",
    "Trains were once the fastest way to cross a country. In the twentieth century, cars and planes took many "
    "of their passengers. Today some countries are building new high-speed lines because trains use less "
    "energy per traveler and go straight into city centers.",
    "Leo wanted to run a marathon but had never run more than five kilometers. He followed a plan that added a "
    "little distance each week and included rest days. Sixteen weeks later he finished the race in just under "
    "four and a half hours.",
    "Octopuses are known for being clever. In aquariums, some have learned to open jars, escape from their "
    "tanks at night and recognize the people who feed them. Scientists study them to understand how "
    "intelligence can develop in animals very different from us.",
    "The neighborhood garden began as an empty parking lot. Volunteers brought soil, built raised beds and "
    "planted vegetables and flowers. Now forty families share the space, and the extra harvest is given to a "
    "food bank every Saturday.",
    "Paper was invented in China around two thousand years ago. The method spread slowly along trade routes "
    "to the Middle East and then to Europe. Cheaper paper later helped books, letters and newspapers become "
    "part of everyday life.",
    "A family tried going one month without buying any new clothes, toys or gadgets. They repaired what broke "
    "and borrowed what they needed. At the end they had saved several hundred dollars and said they did not "
    "miss most of the things they would have bought.",
    "Wind turbines turn the energy of moving air into electricity. The blades spin a shaft connected to a "
    "generator. Because the wind does not always blow, power companies combine wind with other sources and "
    "with batteries that store energy for calm days.",
    "Sara opened a tiny bookshop in a former train station. She sells second-hand books, serves tea and hosts "
    "a reading club every Thursday. The shop is small, but travelers often stop by while they wait for "
    "their connection.",
    "Sleep helps the brain sort and store what we learned during the day. Students who sleep well before an "
    "exam often remember more than those who stay up late studying. Experts suggest a regular bedtime and "
    "less screen time in the evening.",
    "A mountain village was losing young people to the cities. The council set up fast internet and a shared "
    "office in the old school building. Within two years, a dozen remote workers had moved in, and the "
    "village shop reopened.",
    "The first bicycles had no pedals: riders pushed themselves along with their feet. Later designs added "
    "pedals on a huge front wheel, which made falls dangerous. The modern bicycle, with two equal wheels and "
    "a chain, became popular in the 1890s.",
    "Composting turns food scraps and garden waste into rich soil. Microbes, worms and fungi break the material "
    "down over a few months. A good compost pile needs a mix of green and brown materials, some air and a "
    "little moisture.",
]
SUMMARY_ASKS = ["Summarize this paragraph in one sentence:", "Give me the main idea of this text:",
                "Write a short title and a one-line summary for this paragraph:",
                "What are the two most important points in this paragraph?",
                "Summarize the following for a busy reader in under 30 words:"]

SENTENCES = ["hey can u send me the file asap", "The meeting got moved because the boss was sick.",
             "I think your idea is kind of bad.", "We are out of milk again and nobody bought any.",
             "Thanks a lot for the help, it was super useful!", "The product arrived late and it was broken.",
             "Please do not park in front of the garage door.", "Our team did a great job this quarter.",
             "I can't come to the party on Saturday.", "The results of the test were not good.",
             "Can you tell me where the station is?", "This software is really hard to use."]
REWRITE_STYLES = ["more formal", "more polite", "more friendly", "shorter", "more enthusiastic",
                  "suitable for a business email"]

ADVICE = ["I have trouble falling asleep at night", "I want to read more books this year",
          "I keep forgetting my friends' birthdays", "I feel nervous before speaking in meetings",
          "I spend too much money on takeaway food", "I want to learn to cook but don't know where to start",
          "my desk is always messy", "I want to get fitter but hate running",
          "I have a big exam in two weeks", "I just adopted a kitten", "I moved to a city where I know nobody",
          "I want to start saving for a holiday", "I procrastinate on my homework",
          "I want to spend less time on my phone"]

BUSINESSES = ["a bike repair shop", "a vegan bakery", "a dog walking service", "a small bookstore",
              "a language school", "a plant nursery", "a cleaning company", "a coffee truck", "a yoga studio",
              "a second-hand clothing shop", "a music school", "a family-run pizza place"]

STORY_PROBLEMS = [
    ("{name} has {a} marbles and buys {b} more. Then {name} gives away {c}. How many marbles are left?",
     lambda a, b, c: a + b - c),
    ("A shop sells pencils in boxes of {a}. A teacher buys {b} boxes and hands out {c} pencils. How many pencils "
     "does the teacher have left?", lambda a, b, c: a * b - c),
    ("{name} saves {a} dollars a week for {b} weeks and then spends {c} dollars on a gift. How much money is "
     "left?", lambda a, b, c: a * b - c),
    ("A bus has {a} seats in each of {b} rows. {c} seats are empty. How many people are sitting on the bus?",
     lambda a, b, c: a * b - c),
    ("{name} reads {a} pages on Monday, {b} pages on Tuesday and {c} pages on Wednesday. How many pages did "
     "{name} read in total?", lambda a, b, c: a + b + c),
    ("A farmer has {a} chickens. Each chicken lays {b} eggs a week. The farmer sells {c} eggs. How many eggs does "
     "the farmer keep that week?", lambda a, b, c: a * b - c),
    ("A baker makes {a} trays of rolls with {b} rolls on each tray and sells all but {c}. How many rolls were "
     "sold?", lambda a, b, c: a * b - c),
    ("{name} walks {a} kilometers on each of {b} days and cycles {c} kilometers on the weekend. How far did "
     "{name} travel that week?", lambda a, b, c: a * b + c),
]
NAMES = ["Ava", "Noah", "Zara", "Kenji", "Fatima", "Lucas", "Ines", "Tariq", "Mila", "Omar", "Hana", "Diego",
         "Ruth", "Felix", "Amara", "Ivan"]
