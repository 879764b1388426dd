"""Fact tables for the demo model's training corpus.

Invariants:
- every country has exactly one capital, continent, main language and currency, each a plain
  string; countries whose capital, continent or currency is contested or ambiguous (several
  capitals, transcontinental, recently changed) are left out rather than guessed;
- `name` is unique and never equal to a capital (no "Luxembourg, Luxembourg"), so a correct
  answer can be checked by string match;
- `article` is "the" where English needs it ("the United States"), else "".
A few names keep their accents (Bogotá, Brasília, Reykjavík, ...) so that the byte-level BPE
and the engine's UTF-8 decoding see multi-byte characters split across tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

ATTRIBUTES = ("capital", "continent", "language", "currency")


@dataclass(frozen=True)
class Country:
    name: str
    capital: str
    continent: str
    language: str
    currency: str
    article: str = ""

    @property
    def ref(self) -> str:
        """The name inside a sentence: "France", "the United States"."""
        return f"{self.article} {self.name}" if self.article else self.name

    @property
    def ref_start(self) -> str:
        """The name at the start of a sentence: "France", "The United States"."""
        r = self.ref
        return r[0].upper() + r[1:]

    def value(self, attribute: str) -> str:
        if attribute not in ATTRIBUTES:
            raise ValueError(f"unknown attribute {attribute!r}; expected one of {ATTRIBUTES}")
        return getattr(self, attribute)


_ROWS = [
    # Europe
    ("France", "Paris", "Europe", "French", "euro"),
    ("Germany", "Berlin", "Europe", "German", "euro"),
    ("Italy", "Rome", "Europe", "Italian", "euro"),
    ("Spain", "Madrid", "Europe", "Spanish", "euro"),
    ("Portugal", "Lisbon", "Europe", "Portuguese", "euro"),
    ("United Kingdom", "London", "Europe", "English", "pound sterling", "the"),
    ("Ireland", "Dublin", "Europe", "English", "euro"),
    ("Netherlands", "Amsterdam", "Europe", "Dutch", "euro", "the"),
    ("Belgium", "Brussels", "Europe", "Dutch", "euro"),
    ("Switzerland", "Bern", "Europe", "German", "Swiss franc"),
    ("Austria", "Vienna", "Europe", "German", "euro"),
    ("Poland", "Warsaw", "Europe", "Polish", "Polish zloty"),
    ("Czech Republic", "Prague", "Europe", "Czech", "Czech koruna", "the"),
    ("Slovakia", "Bratislava", "Europe", "Slovak", "euro"),
    ("Hungary", "Budapest", "Europe", "Hungarian", "Hungarian forint"),
    ("Romania", "Bucharest", "Europe", "Romanian", "Romanian leu"),
    ("Greece", "Athens", "Europe", "Greek", "euro"),
    ("Sweden", "Stockholm", "Europe", "Swedish", "Swedish krona"),
    ("Norway", "Oslo", "Europe", "Norwegian", "Norwegian krone"),
    ("Denmark", "Copenhagen", "Europe", "Danish", "Danish krone"),
    ("Finland", "Helsinki", "Europe", "Finnish", "euro"),
    ("Iceland", "Reykjavík", "Europe", "Icelandic", "Icelandic króna"),
    ("Estonia", "Tallinn", "Europe", "Estonian", "euro"),
    ("Latvia", "Riga", "Europe", "Latvian", "euro"),
    ("Lithuania", "Vilnius", "Europe", "Lithuanian", "euro"),
    ("Ukraine", "Kyiv", "Europe", "Ukrainian", "Ukrainian hryvnia"),
    ("Serbia", "Belgrade", "Europe", "Serbian", "Serbian dinar"),
    ("Croatia", "Zagreb", "Europe", "Croatian", "euro"),
    ("Slovenia", "Ljubljana", "Europe", "Slovene", "euro"),
    ("Albania", "Tirana", "Europe", "Albanian", "Albanian lek"),
    ("Russia", "Moscow", "Europe", "Russian", "Russian ruble"),
    ("Malta", "Valletta", "Europe", "Maltese", "euro"),
    ("North Macedonia", "Skopje", "Europe", "Macedonian", "Macedonian denar"),
    ("Montenegro", "Podgorica", "Europe", "Montenegrin", "euro"),
    # Asia
    ("Japan", "Tokyo", "Asia", "Japanese", "Japanese yen"),
    ("China", "Beijing", "Asia", "Chinese", "Chinese yuan"),
    ("India", "New Delhi", "Asia", "Hindi", "Indian rupee"),
    ("South Korea", "Seoul", "Asia", "Korean", "South Korean won"),
    ("North Korea", "Pyongyang", "Asia", "Korean", "North Korean won"),
    ("Vietnam", "Hanoi", "Asia", "Vietnamese", "Vietnamese dong"),
    ("Thailand", "Bangkok", "Asia", "Thai", "Thai baht"),
    ("Malaysia", "Kuala Lumpur", "Asia", "Malay", "Malaysian ringgit"),
    ("Philippines", "Manila", "Asia", "Filipino", "Philippine peso", "the"),
    ("Pakistan", "Islamabad", "Asia", "Urdu", "Pakistani rupee"),
    ("Bangladesh", "Dhaka", "Asia", "Bengali", "Bangladeshi taka"),
    ("Nepal", "Kathmandu", "Asia", "Nepali", "Nepalese rupee"),
    ("Iran", "Tehran", "Asia", "Persian", "Iranian rial"),
    ("Iraq", "Baghdad", "Asia", "Arabic", "Iraqi dinar"),
    ("Saudi Arabia", "Riyadh", "Asia", "Arabic", "Saudi riyal"),
    ("Jordan", "Amman", "Asia", "Arabic", "Jordanian dinar"),
    ("Syria", "Damascus", "Asia", "Arabic", "Syrian pound"),
    ("Lebanon", "Beirut", "Asia", "Arabic", "Lebanese pound"),
    ("Kuwait", "Kuwait City", "Asia", "Arabic", "Kuwaiti dinar"),
    ("Qatar", "Doha", "Asia", "Arabic", "Qatari riyal"),
    ("United Arab Emirates", "Abu Dhabi", "Asia", "Arabic", "UAE dirham", "the"),
    ("Oman", "Muscat", "Asia", "Arabic", "Omani rial"),
    ("Mongolia", "Ulaanbaatar", "Asia", "Mongolian", "Mongolian tugrik"),
    ("Kazakhstan", "Astana", "Asia", "Kazakh", "Kazakhstani tenge"),
    ("Uzbekistan", "Tashkent", "Asia", "Uzbek", "Uzbek som"),
    ("Myanmar", "Naypyidaw", "Asia", "Burmese", "Myanmar kyat"),
    ("Cambodia", "Phnom Penh", "Asia", "Khmer", "Cambodian riel"),
    ("Laos", "Vientiane", "Asia", "Lao", "Lao kip"),
    ("Armenia", "Yerevan", "Asia", "Armenian", "Armenian dram"),
    ("Azerbaijan", "Baku", "Asia", "Azerbaijani", "Azerbaijani manat"),
    ("Bhutan", "Thimphu", "Asia", "Dzongkha", "Bhutanese ngultrum"),
    ("Kyrgyzstan", "Bishkek", "Asia", "Kyrgyz", "Kyrgyz som"),
    ("Tajikistan", "Dushanbe", "Asia", "Tajik", "Tajik somoni"),
    ("Turkmenistan", "Ashgabat", "Asia", "Turkmen", "Turkmen manat"),
    # Africa
    ("Egypt", "Cairo", "Africa", "Arabic", "Egyptian pound"),
    ("Nigeria", "Abuja", "Africa", "English", "Nigerian naira"),
    ("Kenya", "Nairobi", "Africa", "Swahili", "Kenyan shilling"),
    ("Ethiopia", "Addis Ababa", "Africa", "Amharic", "Ethiopian birr"),
    ("Ghana", "Accra", "Africa", "English", "Ghanaian cedi"),
    ("Morocco", "Rabat", "Africa", "Arabic", "Moroccan dirham"),
    ("Algeria", "Algiers", "Africa", "Arabic", "Algerian dinar"),
    ("Tunisia", "Tunis", "Africa", "Arabic", "Tunisian dinar"),
    ("Libya", "Tripoli", "Africa", "Arabic", "Libyan dinar"),
    ("Sudan", "Khartoum", "Africa", "Arabic", "Sudanese pound"),
    ("Tanzania", "Dodoma", "Africa", "Swahili", "Tanzanian shilling"),
    ("Uganda", "Kampala", "Africa", "English", "Ugandan shilling"),
    ("Rwanda", "Kigali", "Africa", "Kinyarwanda", "Rwandan franc"),
    ("Senegal", "Dakar", "Africa", "French", "West African CFA franc"),
    ("Angola", "Luanda", "Africa", "Portuguese", "Angolan kwanza"),
    ("Mozambique", "Maputo", "Africa", "Portuguese", "Mozambican metical"),
    ("Zambia", "Lusaka", "Africa", "English", "Zambian kwacha"),
    ("Namibia", "Windhoek", "Africa", "English", "Namibian dollar"),
    ("Madagascar", "Antananarivo", "Africa", "Malagasy", "Malagasy ariary"),
    ("Cameroon", "Yaoundé", "Africa", "French", "Central African CFA franc"),
    ("Somalia", "Mogadishu", "Africa", "Somali", "Somali shilling"),
    ("Gabon", "Libreville", "Africa", "French", "Central African CFA franc"),
    ("Eritrea", "Asmara", "Africa", "Tigrinya", "Eritrean nakfa"),
    ("Mauritania", "Nouakchott", "Africa", "Arabic", "Mauritanian ouguiya"),
    ("Guinea", "Conakry", "Africa", "French", "Guinean franc"),
    ("Sierra Leone", "Freetown", "Africa", "English", "Sierra Leonean leone"),
    ("Liberia", "Monrovia", "Africa", "English", "Liberian dollar"),
    ("Togo", "Lomé", "Africa", "French", "West African CFA franc"),
    # North America
    ("United States", "Washington", "North America", "English", "US dollar", "the"),
    ("Canada", "Ottawa", "North America", "English", "Canadian dollar"),
    ("Mexico", "Mexico City", "North America", "Spanish", "Mexican peso"),
    ("Cuba", "Havana", "North America", "Spanish", "Cuban peso"),
    ("Guatemala", "Guatemala City", "North America", "Spanish", "Guatemalan quetzal"),
    ("Honduras", "Tegucigalpa", "North America", "Spanish", "Honduran lempira"),
    ("Nicaragua", "Managua", "North America", "Spanish", "Nicaraguan córdoba"),
    ("Costa Rica", "San José", "North America", "Spanish", "Costa Rican colón"),
    ("Panama", "Panama City", "North America", "Spanish", "Panamanian balboa"),
    ("Jamaica", "Kingston", "North America", "English", "Jamaican dollar"),
    ("Dominican Republic", "Santo Domingo", "North America", "Spanish", "Dominican peso", "the"),
    ("El Salvador", "San Salvador", "North America", "Spanish", "US dollar"),
    # South America
    ("Brazil", "Brasília", "South America", "Portuguese", "Brazilian real"),
    ("Argentina", "Buenos Aires", "South America", "Spanish", "Argentine peso"),
    ("Chile", "Santiago", "South America", "Spanish", "Chilean peso"),
    ("Peru", "Lima", "South America", "Spanish", "Peruvian sol"),
    ("Colombia", "Bogotá", "South America", "Spanish", "Colombian peso"),
    ("Venezuela", "Caracas", "South America", "Spanish", "Venezuelan bolívar"),
    ("Ecuador", "Quito", "South America", "Spanish", "US dollar"),
    ("Paraguay", "Asunción", "South America", "Spanish", "Paraguayan guaraní"),
    ("Uruguay", "Montevideo", "South America", "Spanish", "Uruguayan peso"),
    ("Guyana", "Georgetown", "South America", "English", "Guyanese dollar"),
    ("Suriname", "Paramaribo", "South America", "Dutch", "Surinamese dollar"),
    # Oceania
    ("Australia", "Canberra", "Oceania", "English", "Australian dollar"),
    ("New Zealand", "Wellington", "Oceania", "English", "New Zealand dollar"),
    ("Fiji", "Suva", "Oceania", "English", "Fijian dollar"),
    ("Papua New Guinea", "Port Moresby", "Oceania", "English", "Papua New Guinean kina"),
    ("Samoa", "Apia", "Oceania", "Samoan", "Samoan tala"),
    ("Vanuatu", "Port Vila", "Oceania", "Bislama", "Vanuatu vatu"),
]

COUNTRIES: tuple[Country, ...] = tuple(Country(*r) for r in _ROWS)

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)
NUMBER_WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen", "twenty",
)


def check_tables() -> None:
    """Raises ValueError if an invariant of the module docstring does not hold."""
    names = [c.name for c in COUNTRIES]
    if len(set(names)) != len(names):
        raise ValueError("duplicate country names in the fact table")
    capitals = {c.capital for c in COUNTRIES}
    clash = sorted(set(names) & capitals)
    if clash:
        raise ValueError(f"country names equal to some capital: {clash}")
    for c in COUNTRIES:
        for a in ATTRIBUTES:
            if not c.value(a) or c.value(a) != c.value(a).strip():
                raise ValueError(f"{c.name}: empty or padded {a}")
        if c.article not in ("", "the"):
            raise ValueError(f"{c.name}: unexpected article {c.article!r}")
