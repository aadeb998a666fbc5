"""The small English text the families' tiny tokenizers are trained on (built in: no downloads)."""

CORPUS = """\
Hello, thanks for calling. How can I help you today?
Hi! I would like to know the opening hours of the library on Saturday.
The library opens at nine in the morning and closes at five in the afternoon.
Could you tell me what the weather will be like tomorrow?
Tomorrow will be sunny with a light breeze, and it should stay warm until the evening.
I need to book a table for two people at seven o'clock tonight.
Of course. I have booked a table for two at seven. Is there anything else?
Please remind me to call my sister when I get home.
Sure, I will remind you to call your sister as soon as you arrive home.
What is the capital of France? The capital of France is Paris.
How far is it from the station to the museum? It is about ten minutes on foot.
Can you play some quiet music while I read? Here is a calm piano playlist.
Sorry, I did not catch that. Could you say it again, a little more slowly?
Yes, of course. I said that the meeting has moved to Thursday afternoon.
Thank you very much, that was really helpful. Have a nice day!
You are welcome. Goodbye, and take care.
The quick brown fox jumps over the lazy dog, and the dog does not seem to mind.
Numbers such as one, two, three, four, five, six, seven, eight, nine and ten appear often.
She sells sea shells by the sea shore, and the shells she sells are surely sea shells.
A voice assistant listens, thinks, and then speaks its answer out loud.
When the caller speaks over the assistant, it stops talking and listens again.
Questions, answers, greetings and small talk make up most of a friendly conversation.
"""
